//! Where PostgreSQL's server programs are looked for: shared by the crate
//! and its build script (which marks the database tests ignored when none
//! are found).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folders looked at, in order: `$PG_BIN`, Debian's
/// `/usr/lib/postgresql/<version>/bin` (the newest first), then the `PATH`
/// (an empty path).
pub(crate) fn candidates() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("PG_BIN") {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|v| std::cmp::Reverse(v.0));
        candidates.extend(versions.into_iter().map(|(_, p)| p));
    }
    candidates.push(PathBuf::new());
    candidates
}

/// The first folder whose `initdb` reports a major version of 13 or later
/// (`pg_xact_status` is 13's) and that has `pg_ctl` beside it.
pub(crate) fn find() -> Option<PathBuf> {
    candidates().into_iter().find(|dir| {
        let version = Command::new(dir.join("initdb")).arg("--version").output();
        let Ok(out) = version else { return false };
        let text = String::from_utf8_lossy(&out.stdout);
        // "initdb (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
        let major = text
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.split('.').next())
            .and_then(|v| v.parse::<u32>().ok());
        major.is_some_and(|m| m >= 13) && has(dir, "pg_ctl")
    })
}

fn has(dir: &Path, program: &str) -> bool {
    Command::new(dir.join(program))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}
