//! The atomics and locks of the core's `const`-made shared state (the
//! breaker's state word, the token bucket, the budgets' and admission's
//! tagged slots, the learned delay's window), named once so that the
//! model-checking build swaps them all. (What is made at run time, as the
//! outbox's books, names `loom`'s types itself under `--cfg loom`.)
//!
//! In a normal build these are `std`'s, re-exported: no cost. Built with
//! `--cfg loom` (CI: `RUSTFLAGS="--cfg loom" cargo test -p retries-core --lib
//! --release loom`), they are `loom`'s, so the protocols' own code runs under
//! every interleaving `loom` explores; the models are in `loom_models.rs`
//! beside each protocol. `loom`'s types have no `const fn new`, and the
//! core's breakers, budgets and delays are made in `static`s, so each one
//! here keeps its first value and makes its `loom` object at its first use
//! (inside the model, where `loom` wants it).

#[cfg(all(not(loom), feature = "tokio"))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

#[cfg(loom)]
pub(crate) use model::{AtomicBool, AtomicU32, AtomicU64, Mutex};

#[cfg(loom)]
mod model {
    use std::fmt;
    use std::ops::Deref;

    // Each value holds its first value and, once made, a leaked `loom` object
    // (one small allocation per object per model run). A `std` mutex holds
    // the reference, not a `OnceLock`: a `OnceLock` has a destructor, which
    // the core's `const fn`s could not drop; this has none.
    macro_rules! lazy_atomic {
        ($($name:ident($int:ty)),*) => {$(
            /// `loom`'s atomic, made at its first use from the value given
            /// to `new` (a `const fn`, as `std`'s is).
            pub(crate) struct $name {
                first: $int,
                made: std::sync::Mutex<Option<&'static loom::sync::atomic::$name>>,
            }

            impl $name {
                pub(crate) const fn new(first: $int) -> Self {
                    Self { first, made: std::sync::Mutex::new(None) }
                }
            }

            impl Deref for $name {
                type Target = loom::sync::atomic::$name;

                fn deref(&self) -> &Self::Target {
                    let mut made = self.made.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    *made.get_or_insert_with(|| {
                        Box::leak(Box::new(loom::sync::atomic::$name::new(self.first)))
                    })
                }
            }

            impl fmt::Debug for $name {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str(stringify!($name))
                }
            }
        )*};
    }

    lazy_atomic!(AtomicBool(bool), AtomicU32(u32), AtomicU64(u64));

    /// `loom`'s mutex, made at its first use from the value given to `new`.
    pub(crate) struct Mutex<T: 'static> {
        first: std::sync::Mutex<Option<T>>,
        made: std::sync::Mutex<Option<&'static loom::sync::Mutex<T>>>,
    }

    impl<T> Mutex<T> {
        pub(crate) const fn new(first: T) -> Self {
            Self {
                first: std::sync::Mutex::new(Some(first)),
                made: std::sync::Mutex::new(None),
            }
        }
    }

    impl<T> Deref for Mutex<T> {
        type Target = loom::sync::Mutex<T>;

        fn deref(&self) -> &Self::Target {
            let mut made = self
                .made
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *made.get_or_insert_with(|| {
                let first = self.first.lock().ok().and_then(|mut f| f.take());
                match first {
                    Some(first) => Box::leak(Box::new(loom::sync::Mutex::new(first))),
                    // Made once, under `made`'s lock.
                    None => unreachable!("a model mutex made twice"),
                }
            })
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex")
        }
    }
}
