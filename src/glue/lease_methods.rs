//! The five methods of Mastra's `LeaseProvider`, and `getLease`, written once for every
//! provider class.
//! Each checks its arguments (`args.rs`) and hands the call to its class's `submit`, which
//! answers a closed provider or bad input at once and runs the rest in the class's store.

/// Adds `acquireLease`, `getLeaseOwner`, `releaseLease`, `renewLease`, `transferLease` and
/// `getLease` to a `#[napi]` class that has `fn submit(&self, env, call: Result<Call>) ->
/// Unknown`.
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
                self.submit(
                    env,
                    args::acquire_lease(e, key.raw(), owner.raw(), ttl_ms.raw()),
                )
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
                self.submit(env, args::get_lease_owner(env.raw(), key.raw()))
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
                self.submit(env, args::release_lease(env.raw(), key.raw(), owner.raw()))
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
                self.submit(
                    env,
                    args::renew_lease(e, key.raw(), owner.raw(), ttl_ms.raw()),
                )
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
                self.submit(env, call)
            }

            /// The live lease on `key` whole: `{ owner, token, ttlMs }`, or `undefined`.
            /// After a transfer, the new holder learns its fencing token here.
            #[napi(
                catch_unwind,
                ts_args_type = "key: string",
                ts_return_type = "Promise<LeaseState | undefined>"
            )]
            pub fn get_lease<'env>(&self, env: &'env Env, key: Unknown<'env>) -> Unknown<'env> {
                self.submit(env, args::get_lease(env.raw(), key.raw()))
            }
        }
    };
}

pub(super) use lease_methods;
