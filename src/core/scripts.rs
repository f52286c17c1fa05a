//! Every Lua script the core runs, listed in one place. Each is a file beside the code that
//! runs it, with a header naming its KEYS, ARGV and answer; all are compiled into the addon,
//! hashed once, and sent by SHA (EVALSHA), loaded again on NOSCRIPT (after a restart or a
//! SCRIPT FLUSH). Keys and values travel in KEYS and ARGV, never in the source.

use std::sync::OnceLock;

use redis::Script;

/// A script's source, and the script made from it on first use.
pub(crate) struct Lua {
    pub source: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    const fn new(source: &'static str) -> Self {
        Self {
            source,
            script: OnceLock::new(),
        }
    }

    /// The script, its SHA computed once.
    pub fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.source))
    }
}

/// Claims a free or expired lease, or refreshes the owner's own.
pub(crate) static ACQUIRE: Lua = Lua::new(include_str!("lease/acquire.lua"));
/// Extends a lease its owner still holds.
pub(crate) static RENEW: Lua = Lua::new(include_str!("lease/renew.lua"));
/// Deletes a lease its owner holds.
pub(crate) static RELEASE: Lua = Lua::new(include_str!("lease/release.lua"));
/// Hands a lease from one owner to another without ever freeing it.
pub(crate) static TRANSFER: Lua = Lua::new(include_str!("lease/transfer.lua"));
/// Reads a live lease whole: owner, fencing token, time left.
pub(crate) static LEASE: Lua = Lua::new(include_str!("lease/lease.lua"));
/// Reads who holds a live lease: owner and metadata.
pub(crate) static RECORD: Lua = Lua::new(include_str!("lease/record.lua"));

/// The lease scripts, loaded together when Redis has forgotten one (it forgets all at once).
pub(crate) static LEASE_SCRIPTS: [&Lua; 6] =
    [&ACQUIRE, &RENEW, &RELEASE, &TRANSFER, &LEASE, &RECORD];

/// Appends events again, each exactly once, after a broken connection.
pub(crate) static APPEND_AGAIN: Lua = Lua::new(include_str!("streams/append_again.lua"));
/// Settles a group's entry (ack, or redeliver and ack) while the consumer still owns it.
pub(crate) static SETTLE: Lua = Lua::new(include_str!("streams/settle.lua"));
/// Takes over idle entries of a group, with how often Redis has delivered each.
pub(crate) static RECLAIM: Lua = Lua::new(include_str!("streams/reclaim.lua"));
/// Keeps the entries a live consumer holds claimed.
pub(crate) static KEEP: Lua = Lua::new(include_str!("streams/keep.lua"));
/// Trims a stream without cutting what a group has not settled.
pub(crate) static TRIM: Lua = Lua::new(include_str!("streams/trim.lua"));
/// Deletes a page of one run's entries, sparing those a group holds unsettled.
pub(crate) static TRIM_TOPIC: Lua = Lua::new(include_str!("streams/trim_topic.lua"));

/// Every script declares each key it touches in KEYS, as Redis asks of scripts (a cluster
/// routes by the declared keys) and as Dragonfly and some managed services enforce. Redis 7.0,
/// which the tests run, does not check it at run time, so the sources are read instead: each
/// command a script runs (`redis.call`, `redis.pcall`, or a table it unpacks into one) is
/// looked up in a table of where that command takes its keys, and each argument there must be
/// `KEYS[n]`, with `n` named in the script's header.
#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Where each command the scripts run takes its keys: the positions of its arguments
    /// (after the name) that are keys, `None` for "every one". A channel counts as a key:
    /// on a cluster a shard channel is routed by its slot, as a key is.
    fn key_positions(command: &str) -> Option<Option<&'static [usize]>> {
        Some(match command {
            "DEL" | "EXISTS" => None,
            "TIME" => Some(&[]),
            "XINFO" => Some(&[1]),
            "GET" | "SET" | "PEXPIRE" | "PTTL" | "INCR" | "SPUBLISH" | "PUBLISH" | "XADD"
            | "XACK" | "XRANGE" | "XREVRANGE" | "XPENDING" | "XCLAIM" | "XAUTOCLAIM" | "XTRIM"
            | "XDEL" => Some(&[0]),
            _ => return None,
        })
    }

    /// The source without its comments (none of the scripts has `--` inside a string).
    fn code(source: &str) -> String {
        source
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The text between the bracket opened just before `from` and the one closing it, split
    /// at its top-level commas.
    fn arguments(code: &str, from: usize) -> Vec<String> {
        let (mut depth, mut quote, mut args, mut arg) = (0usize, None, Vec::new(), String::new());
        for c in code[from..].chars() {
            match (quote, c) {
                (Some(q), _) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(c),
                (None, '(' | '{' | '[') => depth += 1,
                (None, ')' | '}' | ']') if depth == 0 => break,
                (None, ')' | '}' | ']') => depth -= 1,
                (None, ',') if depth == 0 => {
                    args.push(std::mem::take(&mut arg).trim().to_owned());
                    continue;
                }
                _ => {}
            }
            arg.push(c);
        }
        args.push(arg.trim().to_owned());
        args
    }

    /// The command forms in `code`: each `redis.call(…)`/`redis.pcall(…)` and each table
    /// that starts with a command's name (built to be unpacked into a call), as argument
    /// lists, the quoted command name first. A call whose command is not a literal must
    /// unpack a table of the script (`unpack(claim)`), which is checked as a form itself.
    fn forms(name: &str, code: &str) -> Vec<Vec<String>> {
        let mut forms = Vec::new();
        for opener in ["redis.call(", "redis.pcall(", "{"] {
            for (at, _) in code.match_indices(opener) {
                let args = arguments(code, at + opener.len());
                let first = &args[0];
                if opener == "{" {
                    if first.starts_with('\'') {
                        forms.push(args);
                    }
                } else if first.starts_with('\'') {
                    forms.push(args);
                } else {
                    let table = first
                        .strip_prefix("unpack(")
                        .and_then(|t| t.strip_suffix(')'))
                        .unwrap_or_else(|| {
                            panic!("{name}: a command that is not a literal: {first}")
                        });
                    assert!(
                        code.contains(&format!("local {table} = {{")),
                        "{name}: unpacks {table}, which is not a table the script builds"
                    );
                }
            }
        }
        forms
    }

    /// Checks one script: how many command forms it has, or what is wrong with it.
    fn check(name: &str, source: &str) -> Result<usize, String> {
        let code = code(source);
        let forms = forms(name, &code);
        for args in &forms {
            let command = args[0].trim_matches('\'').to_ascii_uppercase();
            let Some(keys) = key_positions(&command) else {
                return Err(format!(
                    "{name}: {command} is not in the table of where commands take keys"
                ));
            };
            let rest = &args[1..];
            let at: Vec<usize> = match keys {
                Some(at) => at.to_vec(),
                None => (0..rest.len()).collect(),
            };
            for i in at {
                let key = rest.get(i).map_or("", String::as_str);
                let n = key
                    .strip_prefix("KEYS[")
                    .and_then(|k| k.strip_suffix(']'))
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| format!("{name}: {command} touches {key:?}, not a KEYS[n]"))?;
                if !source
                    .lines()
                    .any(|l| l.starts_with(&format!("-- KEYS[{n}]")))
                {
                    return Err(format!(
                        "{name}: KEYS[{n}] is used but the header does not name it"
                    ));
                }
            }
        }
        Ok(forms.len())
    }

    #[test]
    fn every_script_declares_in_keys_every_key_it_touches() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
        let mut checked = 0;
        for dir in ["lease", "streams"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "lua") {
                    continue;
                }
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let source = std::fs::read_to_string(&path).unwrap();
                checked += check(&name, &source).unwrap_or_else(|err| panic!("{err}"));
            }
        }
        // A parser that found no command would pass every script: the eleven scripts have 51.
        assert!(checked >= 49, "only {checked} command forms found");
    }

    #[test]
    fn the_check_refuses_a_key_built_in_the_script_an_undeclared_one_and_an_unknown_command() {
        let header = "-- KEYS[1]  the lease key\n";
        let built = format!("{header}local k = KEYS[1] .. ':x'\nredis.call('GET', k)\n");
        assert!(check("built.lua", &built).unwrap_err().contains("\"k\""));
        let undeclared = format!("{header}redis.call('DEL', KEYS[1], KEYS[2])\n");
        assert!(check("undeclared.lua", &undeclared)
            .unwrap_err()
            .contains("KEYS[2]"));
        let unpacked =
            format!("{header}local c = {{ 'XCLAIM', ARGV[1] }}\nredis.call(unpack(c))\n");
        assert!(check("unpacked.lua", &unpacked)
            .unwrap_err()
            .contains("ARGV[1]"));
        let unknown = format!("{header}redis.call('HSET', KEYS[1], 'f', 'v')\n");
        assert!(check("unknown.lua", &unknown).unwrap_err().contains("HSET"));
        let fine =
            format!("{header}redis.pcall('SPUBLISH', KEYS[1], 'm') -- KEYS[9] in a comment\n");
        assert_eq!(check("fine.lua", &fine), Ok(1));
    }
}
