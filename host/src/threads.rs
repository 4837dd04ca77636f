//! A query's threads: `query.threads` bounds how many threads work for one query at once,
//! whatever is running in parallel at the time — a batch's files being decoded (or the next
//! batch's, ahead), the state partitions of an operator, the columns of a Parquet file.
//!
//! Why one budget rather than a count per part: the parts overlap. The next batch's files are
//! decoded while the operator commits its partitions and the sink encodes its columns; each
//! part taking `threads − 1` helpers of its own would run up to three times the threads asked
//! for, and under `weir serve` a tenant's `max_threads` exists so that its batches cannot take
//! every core. So a part asks the budget for helpers, gets what is free (perhaps none, and then
//! works on its own thread alone), and each helper gives its place back when its thread ends.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The threads of one query: the one running the batch, plus helpers drawn from the budget.
/// Clones share the budget.
#[derive(Debug, Clone)]
pub struct Threads {
    total: NonZeroUsize,
    /// Helpers not taken: `total − 1` when nothing runs in parallel.
    free: Arc<AtomicUsize>,
}

impl Threads {
    /// A budget of `total` threads (this one included).
    pub fn new(total: NonZeroUsize) -> Self {
        Self {
            total,
            free: Arc::new(AtomicUsize::new(total.get() - 1)),
        }
    }

    /// The `query.threads` the budget was made with.
    pub fn get(&self) -> usize {
        self.total.get()
    }

    /// Up to `want` helpers, as many as are free (perhaps none).
    pub fn helpers(&self, want: usize) -> Vec<Helper> {
        let mut free = self.free.load(Ordering::Relaxed);
        loop {
            let take = want.min(free);
            if take == 0 {
                return Vec::new();
            }
            match self.free.compare_exchange_weak(
                free,
                free - take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return (0..take)
                        .map(|_| Helper {
                            free: Arc::clone(&self.free),
                        })
                        .collect();
                }
                Err(now) => free = now,
            }
        }
    }

    /// `f` on every item, on this thread and as many helpers as are free (at most one per
    /// item after the first), each taking the next item in turn. Returns the results in item
    /// order, or the error of the first item that failed; once an item has failed (or panicked)
    /// no other starts, though items after it already under way finish. A helper thread that
    /// cannot be started leaves its items to the others.
    ///
    /// # Errors
    /// The first error `f` returned, by item order.
    pub fn try_map<I, T, E, F>(&self, items: Vec<I>, f: F) -> Result<Vec<T>, E>
    where
        I: Send,
        T: Send,
        E: Send,
        F: Fn(usize, I) -> Result<T, E> + Sync,
    {
        let helpers = self.helpers(items.len().saturating_sub(1));
        if helpers.is_empty() {
            return items
                .into_iter()
                .enumerate()
                .map(|(i, item)| f(i, item))
                .collect();
        }
        let n = items.len();
        let slots: Vec<Mutex<Option<I>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let work = || {
            // Stops the others when `f` panics on this thread.
            let _stop = StopOnPanic(&failed);
            let mut done = Vec::new();
            while !failed.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = slots.get(i).and_then(|s| lock(s).take()) else {
                    break;
                };
                let result = f(i, item);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                done.push((i, result));
            }
            done
        };
        let mut results: Vec<Option<Result<T, E>>> =
            std::iter::repeat_with(|| None).take(n).collect();
        std::thread::scope(|scope| {
            let others: Vec<_> = helpers
                .into_iter()
                .filter_map(|helper| {
                    std::thread::Builder::new()
                        .name("weir-helper".into())
                        .spawn_scoped(scope, move || {
                            let done = work();
                            drop(helper);
                            done
                        })
                        .ok()
                })
                .collect();
            for (i, result) in work() {
                results[i] = Some(result);
            }
            for other in others {
                let done = other
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                for (i, result) in done {
                    results[i] = Some(result);
                }
            }
        });
        // Items are taken in order, so every item before a failed one has its result; the
        // first error by item order comes before any item left undone.
        let mut out = Vec::with_capacity(n);
        for result in results.into_iter().flatten() {
            out.push(result?);
        }
        Ok(out)
    }
}

impl Default for Threads {
    /// One thread: no helpers.
    fn default() -> Self {
        Self::new(NonZeroUsize::MIN)
    }
}

/// Two budgets are alike when they were made with the same count (for configurations that
/// compare equal).
impl PartialEq for Threads {
    fn eq(&self, other: &Self) -> bool {
        self.total == other.total
    }
}

impl Eq for Threads {}

/// Sets its flag when dropped while its thread unwinds from a panic.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// A helper's place in the budget, given back when dropped.
#[derive(Debug)]
pub struct Helper {
    free: Arc<AtomicUsize>,
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.free.fetch_add(1, Ordering::AcqRel);
    }
}

/// A lock that a thread which panicked while holding it does not spoil: what the budget's
/// users guard with it is whole at every step (buffers, an error, an item not yet taken).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threads(n: usize) -> Threads {
        Threads::new(NonZeroUsize::new(n).unwrap())
    }

    #[test]
    fn helpers_are_what_is_free_and_come_back_when_dropped() {
        let t = threads(3);
        let mut a = t.helpers(5);
        assert_eq!(a.len(), 2);
        assert!(t.clone().helpers(1).is_empty(), "clones share the budget");
        a.pop();
        assert_eq!(t.helpers(2).len(), 1);
        drop(a);
        assert_eq!(t.helpers(2).len(), 2);
        assert!(threads(1).helpers(4).is_empty());
    }

    #[test]
    fn try_map_keeps_the_order_and_reports_the_first_error() {
        let t = threads(4);
        let squares = t.try_map((0..50u64).collect(), |i, x| {
            assert_eq!(i as u64, x);
            Ok::<_, String>(x * x)
        });
        assert_eq!(squares.unwrap(), (0..50).map(|x| x * x).collect::<Vec<_>>());
        let failed = t.try_map((0..50u64).collect(), |_, x| {
            if x % 10 == 7 {
                Err(format!("item {x}"))
            } else {
                Ok(x)
            }
        });
        assert_eq!(failed.unwrap_err(), "item 7");
        // Every helper came back.
        assert_eq!(t.helpers(9).len(), 3);
    }

    #[test]
    fn a_panic_in_try_map_stops_the_others_and_gives_every_place_back() {
        let t = threads(3);
        let started = AtomicUsize::new(0);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // 20,000 items of 1 ms: ten seconds on three threads if nothing stopped them.
            t.try_map((0..20_000u32).collect(), |_, x| {
                started.fetch_add(1, Ordering::Relaxed);
                assert_ne!(x, 3, "item 3 panics");
                std::thread::sleep(std::time::Duration::from_millis(1));
                Ok::<_, ()>(x)
            })
        }));
        assert!(result.is_err(), "the panic reaches the caller");
        // The others stop at their next item once the panicking thread unwinds (the panic
        // hook, which prints a backtrace first, can take a while).
        let started = started.load(Ordering::Relaxed);
        assert!(started < 10_000, "{started} items started after the panic");
        assert_eq!(t.helpers(9).len(), 2, "every place came back");
    }

    #[test]
    fn try_map_runs_alone_when_the_budget_is_taken() {
        let t = threads(2);
        let held = t.helpers(1);
        let main = std::thread::current().id();
        let ran_here = t
            .try_map(vec![1, 2, 3], |_, x| {
                Ok::<_, ()>((x, std::thread::current().id() == main))
            })
            .unwrap();
        assert!(ran_here.iter().all(|(_, here)| *here));
        drop(held);
    }
}
