//! Where the Kafka test broker is looked for: shared by the crate's
//! [`broker`](crate::broker) module and its build script (which marks the
//! broker's tests ignored when none is found).

use std::path::PathBuf;
use std::process::Command;

/// The command that installs the broker where it is looked for first after `$TANSU`.
// Public through `broker::INSTALL`; the build script compiles this file too.
#[allow(unreachable_pub)]
pub const INSTALL: &str = "cargo install tansu --version 0.6.0 --locked --debug --no-default-features --features dynostore,libsql --root ~/.cache/retries-ci/tansu && echo dynostore,libsql > ~/.cache/retries-ci/tansu/features";

/// The places looked at, in order: `$TANSU`, the cache `.ci/run` installs
/// into, then `tansu` on the `PATH`.
pub(crate) fn candidates() -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("TANSU") {
        candidates.push(PathBuf::from(p));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/retries-ci/tansu/bin/tansu"));
    }
    candidates.push(PathBuf::from("tansu"));
    candidates
}

/// The first candidate that reports version 0.6.0.
pub(crate) fn find() -> Option<PathBuf> {
    candidates().into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("0.6.0"))
    })
}

/// Whether the binary found was installed with the `libsql` feature (its
/// durable `sqlite://` storage): the install command writes the features it
/// built with into `features` beside `bin/`. A binary without that stamp is
/// taken as having no durable storage (the test that needs it is then
/// ignored, never passed).
pub(crate) fn durable(bin: &std::path::Path) -> bool {
    let bin = if bin.components().count() == 1 {
        // `tansu` on the PATH: where it is.
        std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(bin))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| bin.to_owned())
    } else {
        bin.to_owned()
    };
    bin.parent()
        .and_then(std::path::Path::parent)
        .and_then(|root| std::fs::read_to_string(root.join("features")).ok())
        .is_some_and(|f| f.split([',', '\n', ' ']).any(|x| x.trim() == "libsql"))
}
