//! The five methods of Mastra's `LeaseProvider`, and `getLease`, written once for every
//! provider class.
//! Each checks its arguments (`args.rs`) and hands the call to its class's `submit`, which
//! answers a closed provider or bad input at once and runs the rest in the class's store.

/// Adds `acquireLease`, `getLeaseOwner`, `releaseLease`, `renewLease`, `transferLease`,
/// `getLease` and `stats` to a `#[napi]` class that has `fn submit(&self, env, operation,
/// call: Result<Call>) -> Unknown` and a `stats: Arc<Stats>` field.
macro_rules! lease_methods {
    ($class:ident) => {
        #[napi]
        impl $class {
            /// Claims `key` for `owner` for `ttlMs`, or refreshes the TTL when `owner`
            /// already holds it. Resolves `{ acquired: true, owner, token }` (`token`: the
            /// lease's fencing token), or `{ acquired: false, owner: holder }`.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string, owner: string, ttlMs: number",
                ts_return_type = "Promise<LeaseGrant>"
            )]
            pub fn acquire_lease<'env>(
                &self,
                env: &'env Env,
                key: Unknown<'env>,
                owner: Unknown<'env>,
                ttl_ms: Unknown<'env>,
            ) -> Unknown<'env> {
                let e = env.raw();
                let call = args::acquire_lease(e, key.raw(), owner.raw(), ttl_ms.raw());
                self.submit(env, Operation::AcquireLease, call)
            }

            /// The owner holding a live lease on `key`, or `undefined`.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string",
                ts_return_type = "Promise<string | undefined>"
            )]
            pub fn get_lease_owner<'env>(
                &self,
                env: &'env Env,
                key: Unknown<'env>,
            ) -> Unknown<'env> {
                let call = args::get_lease_owner(env.raw(), key.raw());
                self.submit(env, Operation::GetLeaseOwner, call)
            }

            /// Releases the lease if `owner` holds it; otherwise does nothing.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string, owner: string",
                ts_return_type = "Promise<void>"
            )]
            pub fn release_lease<'env>(
                &self,
                env: &'env Env,
                key: Unknown<'env>,
                owner: Unknown<'env>,
            ) -> Unknown<'env> {
                let call = args::release_lease(env.raw(), key.raw(), owner.raw());
                self.submit(env, Operation::ReleaseLease, call)
            }

            /// Extends the lease to `ttlMs` from now if `owner` still holds it: `true`;
            /// `false` when it was lost. Never brings an expired lease back.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string, owner: string, ttlMs: number",
                ts_return_type = "Promise<boolean>"
            )]
            pub fn renew_lease<'env>(
                &self,
                env: &'env Env,
                key: Unknown<'env>,
                owner: Unknown<'env>,
                ttl_ms: Unknown<'env>,
            ) -> Unknown<'env> {
                let e = env.raw();
                let call = args::renew_lease(e, key.raw(), owner.raw(), ttl_ms.raw());
                self.submit(env, Operation::RenewLease, call)
            }

            /// Hands the lease from `fromOwner` to `toOwner` with a fresh `ttlMs`, atomically
            /// and without the key ever being free: `true`; `false` when `fromOwner` no longer
            /// held it.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string, fromOwner: string, toOwner: string, ttlMs: number",
                ts_return_type = "Promise<boolean>"
            )]
            pub fn transfer_lease<'env>(
                &self,
                env: &'env Env,
                key: Unknown<'env>,
                from_owner: Unknown<'env>,
                to_owner: Unknown<'env>,
                ttl_ms: Unknown<'env>,
            ) -> Unknown<'env> {
                let (e, ttl_ms) = (env.raw(), ttl_ms.raw());
                let call =
                    args::transfer_lease(e, key.raw(), from_owner.raw(), to_owner.raw(), ttl_ms);
                self.submit(env, Operation::TransferLease, call)
            }

            /// The live lease on `key` whole: `{ owner, token, ttlMs }`, or `undefined`.
            /// After a transfer, the new holder learns its fencing token here.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string",
                ts_return_type = "Promise<LeaseState | undefined>"
            )]
            pub fn get_lease<'env>(&self, env: &'env Env, key: Unknown<'env>) -> Unknown<'env> {
                self.submit(
                    env,
                    Operation::GetLease,
                    args::get_lease(env.raw(), key.raw()),
                )
            }

            /// What this provider's lease calls came to since it was made (closed or not):
            /// calls per method, rejections per error code, grants (acquires that left the
            /// caller holding the lease, transfers), refusals (acquires answered with another
            /// owner) and lost leases (renewals answered `false`). For a health endpoint.
            #[napi(catch_unwind)]
            pub fn stats(&self) -> LeaseStats {
                LeaseStats::from(self.stats.snapshot())
            }
        }
    };
}

pub(super) use lease_methods;
