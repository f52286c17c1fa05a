//! The glue's conventions about Node, checked by reading its source (DEVELOPING.md,
//! "Conventions"): no panic reaches Node, and the raw N-API calls live in two known places.
//!
//! - Every function napi-rs exports (`#[napi]` or `#[napi(...)]` on a `fn`, a method or a
//!   constructor) says `catch_unwind`, so napi-rs turns a panic into a thrown error.
//! - Every N-API callback written by hand (an `extern "C" fn` with a body) runs its body in
//!   `catch_unwind` or [`catching`](super::crossing::catching).
//! - Raw `sys::napi_*` calls are made in `js.rs` alone (each wrapped once, for Node's thread),
//!   except the thread-safe functions' own (`napi_*_threadsafe_function`), made from any
//!   thread, in `crossing/tsfn.rs`.
//! - libuv's functions are found and called in `crossing/uv.rs` alone, behind its safe
//!   wrapper.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/glue`, with its path from the crate root.
fn glue_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|err| panic!("{dir:?}: {err}"));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    walk(&root.join("src/glue"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            let name = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            (name, text)
        })
        .collect()
}

/// The index just past the bracket that closes the one at `open` (`(`, `[` or `{`), skipping
/// strings, character literals and comments.
fn closing(text: &str, open: usize) -> usize {
    let bytes = text.as_bytes();
    let (up, down) = match bytes[open] {
        b'(' => (b'(', b')'),
        b'[' => (b'[', b']'),
        _ => (b'{', b'}'),
    };
    let mut depth = 0usize;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\''), not a lifetime ('env).
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < bytes.len() && bytes[i] != b'\'' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b if b == up => depth += 1,
            b if b == down => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unclosed bracket at byte {open}");
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// Whether the byte at `at` starts a line's code (not inside a `//` comment on that line).
fn in_code(text: &str, at: usize) -> bool {
    let start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    !text[start..at].contains("//")
}

/// The item after an attribute ending at `from`, past other attributes, comments and
/// qualifiers: `Some(name)` when it is a function.
fn function_after(text: &str, mut from: usize) -> Option<String> {
    loop {
        let rest = &text[from..];
        let trimmed = rest.trim_start();
        from += rest.len() - trimmed.len();
        if trimmed.starts_with("#[") {
            from = closing(text, from + 1);
        } else if trimmed.starts_with("//") {
            from += trimmed.find('\n').unwrap_or(trimmed.len());
        } else {
            break;
        }
    }
    let mut words = text[from..].split_whitespace();
    loop {
        let word = words.next()?;
        match word {
            "pub" | "async" | "unsafe" | "const" | "extern" | "\"C\"" => {}
            _ if word.starts_with("pub(") => {}
            "fn" => {
                let name = words.next()?;
                return Some(name.split(['(', '<']).next().unwrap_or(name).to_owned());
            }
            _ => return None,
        }
    }
}

#[test]
fn every_exported_function_catches_panics() {
    let mut exported = Vec::new();
    let mut uncaught = Vec::new();
    for (file, text) in glue_files() {
        for (at, _) in text.match_indices("#[napi") {
            let after = text.as_bytes().get(at + 6);
            if !matches!(after, Some(b']' | b'(')) || !in_code(&text, at) {
                continue;
            }
            let end = closing(&text, at + 1);
            let Some(name) = function_after(&text, end) else {
                continue;
            };
            let place = format!("{file}:{} ({name})", line_of(&text, at));
            // A word of the attribute, not of a string in it (a declared type).
            let attribute = &text[at..end];
            let words = attribute.split('"').step_by(2).collect::<String>();
            if !words.contains("catch_unwind") {
                uncaught.push(place.clone());
            }
            exported.push(place);
        }
    }
    assert!(
        exported
            .iter()
            .any(|p| p.contains("redis.rs") && p.ends_with("(new)")),
        "the reader missed RedisLeaseProvider's constructor: {exported:#?}"
    );
    assert!(exported.len() > 20, "too few found: {exported:#?}");
    assert!(
        uncaught.is_empty(),
        "#[napi] functions without catch_unwind (a panic would unwind into Node): {uncaught:#?}"
    );
}

#[test]
fn every_callback_made_by_hand_catches_panics() {
    let mut callbacks = Vec::new();
    let mut uncaught = Vec::new();
    for (file, text) in glue_files() {
        for (at, _) in text.match_indices("extern \"C\" fn") {
            // A function type (`type Free = unsafe extern "C" fn(...)`, a field's or an
            // argument's) has no name and no body.
            let after = text[at + "extern \"C\" fn".len()..].trim_start();
            if after.starts_with('(') || !in_code(&text, at) {
                continue;
            }
            let name = function_after(&text, at).unwrap_or_default();
            let open = at + text[at..].find('{').expect("a function body");
            let body = &text[open..closing(&text, open)];
            let place = format!("{file}:{} ({name})", line_of(&text, at));
            if !body.contains("catch_unwind(") && !body.contains("catching(") {
                uncaught.push(place.clone());
            }
            callbacks.push(place);
        }
    }
    assert!(callbacks.len() >= 6, "too few found: {callbacks:#?}");
    assert!(
        uncaught.is_empty(),
        "N-API callbacks whose body is not in catch_unwind or catching: {uncaught:#?}"
    );
}

#[test]
fn raw_napi_calls_live_in_js_rs_and_tsfn_rs() {
    let mut stray = Vec::new();
    for (file, text) in glue_files() {
        if file.ends_with("glue/js.rs") || file.ends_with("glue/conventions.rs") {
            continue;
        }
        let thread_safe = file.ends_with("glue/crossing/tsfn.rs");
        for (at, _) in text.match_indices("sys::napi_") {
            let name: String = text[at + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let is_call = text[at + 5 + name.len()..].starts_with('(');
            if !is_call || !in_code(&text, at) {
                continue;
            }
            if thread_safe && name.ends_with("_threadsafe_function") {
                continue;
            }
            stray.push(format!("{file}:{} ({name})", line_of(&text, at)));
        }
    }
    assert!(
        stray.is_empty(),
        "raw N-API calls outside js.rs (wrap them there): {stray:#?}"
    );
}

#[test]
fn libuv_is_called_in_uv_rs_alone() {
    let mut stray = Vec::new();
    for (file, text) in glue_files() {
        if file.ends_with("glue/crossing/uv.rs") || file.ends_with("glue/conventions.rs") {
            continue;
        }
        for needle in [
            "dlsym",
            "(uv.",
            "uv_poll_start",
            "uv_async_send",
            "uv_close",
        ] {
            for (at, _) in text.match_indices(needle) {
                if in_code(&text, at) {
                    stray.push(format!("{file}:{} ({needle})", line_of(&text, at)));
                }
            }
        }
    }
    assert!(
        stray.is_empty(),
        "libuv reached outside crossing/uv.rs (wrap it there): {stray:#?}"
    );
}
