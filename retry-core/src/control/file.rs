//! Overrides from a file (feature `config`), in any serde format: the
//! caller's parser reads it (`toml::from_str`, `serde_json::from_str`,
//! `serde_yaml_ng::from_str`), so this crate depends on none of them.
//!
//! The format is in the [module docs](super), "Files".

use std::fmt;
use std::path::Path;
use std::sync::Arc;
#[cfg(feature = "tokio")]
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer};

use super::{ControlError, Force, Override, Source, Unknown};
use crate::policy::Policy;

/// The overrides of a file, read by a serde parser.
#[derive(Debug, Clone, PartialEq)]
pub struct Overrides {
    entries: Vec<(String, Override, Duration)>,
}

impl Overrides {
    /// The entries: call name, override, time to live.
    #[must_use]
    pub fn entries(&self) -> &[(String, Override, Duration)] {
        &self.entries
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    ttl: String,
    retries: Option<String>,
    unknown: Option<String>,
    share: Option<u32>,
    breaker: Option<String>,
    policy: Option<Policy>,
}

impl Doc {
    fn into_override(self) -> Result<(Override, Duration), String> {
        let ttl = crate::config::parse_duration(&self.ttl).map_err(|e| format!("ttl: {e}"))?;
        let mut what = Override::new();
        match self.retries.as_deref() {
            None | Some("on") => {}
            Some("off") => what = what.retries_off(),
            Some(other) => return Err(format!("retries: `{other}`: give \"off\" or \"on\"")),
        }
        match self.unknown.as_deref() {
            None => {}
            Some("stop") => what = what.unknown(Unknown::Stop),
            Some("reconcile-only") => what = what.unknown(Unknown::ReconcileOnly),
            Some(other) => {
                return Err(format!(
                    "unknown: `{other}`: give \"stop\" or \"reconcile-only\""
                ));
            }
        }
        if let Some(share) = self.share {
            what = what.share(share).map_err(|e| e.to_string())?;
        }
        match self.breaker.as_deref() {
            None => {}
            Some("open") => what = what.breaker(Force::Open),
            Some("closed") => what = what.breaker(Force::Closed),
            Some("auto") => what = what.breaker(Force::Auto),
            Some(other) => {
                return Err(format!(
                    "breaker: `{other}`: give \"open\", \"closed\" or \"auto\""
                ));
            }
        }
        if let Some(policy) = self.policy {
            what = what.policy(policy).map_err(|e| e.to_string())?;
        }
        super::check_ttl(ttl).map_err(|e| e.to_string())?;
        Ok((what, ttl))
    }
}

impl<'de> Deserialize<'de> for Overrides {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> de::Visitor<'de> for Visit {
            type Value = Overrides;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from call names to overrides")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Overrides, A::Error> {
                let mut entries = Vec::new();
                while let Some(call) = map.next_key::<String>()? {
                    let doc: Doc = map
                        .next_value()
                        .map_err(|e| de::Error::custom(format!("override `{call}`: {e}")))?;
                    let (what, ttl) = doc
                        .into_override()
                        .map_err(|e| de::Error::custom(format!("override `{call}`: {e}")))?;
                    if call.trim().is_empty() {
                        return Err(de::Error::custom("an override needs a call name"));
                    }
                    entries.push((call, what, ttl));
                }
                Ok(Overrides { entries })
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A single override, as an admin endpoint's request body reads it (the
/// fields of a file's entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OneOverride {
    /// What it changes.
    pub what: Override,
    /// Its time to live.
    pub ttl: Duration,
}

impl<'de> Deserialize<'de> for OneOverride {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let doc = Doc::deserialize(d)?;
        let (what, ttl) = doc.into_override().map_err(de::Error::custom)?;
        Ok(Self { what, ttl })
    }
}

/// Read the file at `path` with `parse` and install its overrides in
/// one swap (replacing what this file installed before). Returns how many
/// it has.
///
/// # Errors
///
/// [`ControlError::Parse`] naming the file, with the parser's message (its
/// line) and the call; nothing is changed then.
pub fn load<E: fmt::Display>(
    path: impl AsRef<Path>,
    parse: impl Fn(&str) -> Result<Overrides, E>,
) -> Result<usize, ControlError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| ControlError::Parse {
        source_name: path.display().to_string(),
        message: e.to_string(),
    })?;
    install(path, &text, &parse)
}

fn install<E: fmt::Display>(
    path: &Path,
    text: &str,
    parse: &impl Fn(&str) -> Result<Overrides, E>,
) -> Result<usize, ControlError> {
    let name = path.display().to_string();
    let overrides = parse(text).map_err(|e| ControlError::Parse {
        source_name: name.clone(),
        message: e.to_string(),
    })?;
    super::replace(&Source::File(Arc::from(name)), &overrides.entries)?;
    Ok(overrides.entries.len())
}

/// A file watched for changes ([`watch`]); dropping it stops the watch
/// (the overrides the file installed stay until their time runs out).
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct Watch {
    task: tokio::task::JoinHandle<()>,
    last: Arc<Mutex<Option<Result<usize, ControlError>>>>,
}

#[cfg(feature = "tokio")]
impl Watch {
    /// The result of the last read that found the file changed: how many
    /// overrides it installed, or why it was refused (the last good set
    /// then stays).
    #[must_use]
    pub fn last(&self) -> Option<Result<usize, ControlError>> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(feature = "tokio")]
impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watch the file at `path`: read now and then every `every`, and when
/// its text changed, install it as [`load`] does. A file that does not
/// parse or validate is refused (a WARN event, and [`Watch::last`]); the
/// last good set stays in force, and a later good file is taken. Spawns a
/// task on the current tokio runtime.
///
/// # Panics
///
/// Outside a tokio runtime.
#[cfg(feature = "tokio")]
pub fn watch<E, P>(path: impl AsRef<Path>, parse: P, every: Duration) -> Watch
where
    E: fmt::Display,
    P: Fn(&str) -> Result<Overrides, E> + Send + 'static,
{
    let path = path.as_ref().to_path_buf();
    let last = Arc::new(Mutex::new(None));
    let told = Arc::clone(&last);
    let task = tokio::spawn(async move {
        let mut seen: Option<String> = None;
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && seen.as_deref() != Some(text.as_str())
            {
                let result = install(&path, &text, &parse);
                if let Err(e) = &result {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(target: "retries::control", error = %e, "override file refused: the last good set stays");
                    #[cfg(not(feature = "tracing"))]
                    let _ = e;
                }
                *told.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
                seen = Some(text);
            }
            tokio::time::sleep(every.max(Duration::from_millis(10))).await;
        }
    });
    Watch { task, last }
}
