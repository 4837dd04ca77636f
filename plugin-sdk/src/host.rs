//! The functions the host offers every plugin (WIT interface `host`), behind plain Rust
//! functions, so that plugin code calls them the same way in the guest and in native tests.
//!
//! In a native build `log` records into a per-thread buffer that [`crate::testing`] exposes, and
//! `random_u64` is a fixed-seed xorshift, so that tests are deterministic.

/// Severity of a [`log`] message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected but handled.
    Warn,
    /// A failure.
    Error,
}

/// Logs `message` through the host's logger, which tags it with the plugin and the batch.
pub fn log(level: Level, message: &str) {
    imp::log(level, message);
}

/// [`log`] at [`Level::Trace`].
pub fn log_trace(message: &str) {
    log(Level::Trace, message);
}

/// [`log`] at [`Level::Debug`].
pub fn log_debug(message: &str) {
    log(Level::Debug, message);
}

/// [`log`] at [`Level::Info`].
pub fn log_info(message: &str) {
    log(Level::Info, message);
}

/// [`log`] at [`Level::Warn`].
pub fn log_warn(message: &str) {
    log(Level::Warn, message);
}

/// [`log`] at [`Level::Error`].
pub fn log_error(message: &str) {
    log(Level::Error, message);
}

/// A callback on native `log` calls (see [`crate::testing::on_log`]).
pub(crate) type LogHook = Box<dyn Fn(Level, &str)>;

/// A random number from the host's source seeded by (query id, batch id, partition), so that a
/// replayed batch draws the same numbers. Natively: a fixed-seed xorshift per thread.
pub fn random_u64() -> u64 {
    imp::random_u64()
}

#[cfg(all(
    target_arch = "wasm32",
    any(feature = "transform", feature = "sink", feature = "scalar-function")
))]
mod imp {
    use super::Level;
    #[cfg(all(
        feature = "scalar-function",
        not(any(feature = "transform", feature = "sink"))
    ))]
    use crate::guest::scalar::bindings::weir::plugin::host as wit_host;
    #[cfg(all(feature = "sink", not(feature = "transform")))]
    use crate::guest::sink::bindings::weir::plugin::host as wit_host;
    #[cfg(feature = "transform")]
    use crate::guest::transform::bindings::weir::plugin::host as wit_host;

    pub(super) fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => wit_host::LogLevel::Trace,
            Level::Debug => wit_host::LogLevel::Debug,
            Level::Info => wit_host::LogLevel::Info,
            Level::Warn => wit_host::LogLevel::Warn,
            Level::Error => wit_host::LogLevel::Error,
        };
        wit_host::log(level, message);
    }

    pub(super) fn random_u64() -> u64 {
        wit_host::random_u64()
    }
}

#[cfg(not(all(
    target_arch = "wasm32",
    any(feature = "transform", feature = "sink", feature = "scalar-function")
)))]
pub(crate) mod imp {
    use super::Level;
    use std::cell::{Cell, RefCell};

    /// Where native tests start the random sequence.
    pub(crate) const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
    /// Native log records kept per thread; older ones are dropped past this many.
    const MAX_RECORDS: usize = 10_000;

    type Hook = super::LogHook;

    thread_local! {
        static RECORDS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
        static STATE: Cell<u64> = const { Cell::new(SEED) };
    }

    pub(crate) fn log(level: Level, message: &str) {
        RECORDS.with_borrow_mut(|r| {
            if r.len() >= MAX_RECORDS {
                r.remove(0);
            }
            r.push((level, message.to_owned()));
        });
        // The hook runs after the record is kept, so a hook that panics (to simulate a crash
        // during this host call) still leaves the record behind.
        HOOK.with_borrow(|hook| {
            if let Some(hook) = hook {
                hook(level, message);
            }
        });
    }

    pub(crate) fn take_records() -> Vec<(Level, String)> {
        RECORDS.with_borrow_mut(std::mem::take)
    }

    pub(crate) fn set_hook(hook: Option<Hook>) {
        HOOK.with_borrow_mut(|h| *h = hook);
    }

    pub(crate) fn random_u64() -> u64 {
        STATE.with(|s| {
            // xorshift64*: tiny, deterministic, good enough for tests.
            let mut x = s.get();
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            s.set(x);
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        })
    }

    pub(crate) fn reset_random(seed: u64) {
        STATE.with(|s| s.set(if seed == 0 { SEED } else { seed }));
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn native_random_is_deterministic_per_seed() {
        imp::reset_random(7);
        let a: Vec<u64> = (0..3).map(|_| random_u64()).collect();
        imp::reset_random(7);
        let b: Vec<u64> = (0..3).map(|_| random_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn native_log_is_recorded() {
        imp::take_records();
        log_info("hello");
        log(Level::Warn, "careful");
        assert_eq!(
            imp::take_records(),
            [
                (Level::Info, "hello".to_owned()),
                (Level::Warn, "careful".to_owned())
            ]
        );
    }
}
