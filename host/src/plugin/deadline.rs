//! The per-call deadline (`limits.timeout`) for the time a plugin spends in
//! host calls, not only in its own code.
//!
//! Epoch interruption stops a guest that spins in Wasm, but it cannot stop
//! the host while it waits on the guest's behalf: a guest that sleeps
//! (`subscribe-duration(u64::MAX)` then `poll`), an HTTP server that never
//! answers, a stream that never fills. Every such wait of WASI goes through
//! `wasi:io`: `poll`, `pollable.block` and the `blocking-*` stream methods
//! (wasi:http included: a response is a pollable future, a body is a stream).
//! So the store links its own `wasi:io/poll` and `wasi:io/streams` over
//! wasmtime-wasi's, which race each wait against the call's deadline; the
//! `keyed-state` and `delta-merge` imports check it themselves. A wait still
//! pending at the deadline fails the call with [`DeadlineExceeded`], which the
//! instance reports as the plugin's time-limit error, like a spinning guest.
//!
//! A guest's clocks stand still during a call (they read the batch timestamp,
//! see `replay`), so a sleep cannot change what it computes: a sleep shorter
//! than what is left of the call waits for real, a longer one waits until the
//! deadline and fails the call there. Replays stay byte-identical either way.
//!
//! Not covered: calls on granted folders (`capabilities.dirs`) run to the end
//! of the file operation; a guest cannot create a FIFO or a device through
//! WASI, so only what the operator put in a granted folder can hold them.

use std::future::Future;
use std::time::Instant;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::io::poll::{Host as AsyncPoll, HostPollable as AsyncPollable};
use wasmtime_wasi::p2::bindings::io::streams::{
    HostInputStream as AsyncInput, HostOutputStream as AsyncOutput,
};
use wasmtime_wasi::p2::bindings::sync::io::{poll, streams};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, DynPollable, StreamError, StreamResult};

use super::state::HostState;

/// A host call of a plugin was still waiting when the call's deadline passed.
#[derive(Debug, thiserror::Error)]
#[error("the time limit passed while the plugin waited in {during}")]
pub(crate) struct DeadlineExceeded {
    /// The host call that was waiting, e.g. `wasi:io/poll.poll`.
    pub(crate) during: &'static str,
}

/// Fails with [`DeadlineExceeded`] when `deadline` has passed.
pub(crate) fn check(deadline: Option<Instant>, during: &'static str) -> wasmtime::Result<()> {
    match deadline {
        Some(deadline) if Instant::now() >= deadline => {
            Err(wasmtime::Error::new(DeadlineExceeded { during }))
        }
        _ => Ok(()),
    }
}

/// Runs `wait` to completion on wasmtime-wasi's runtime (as its sync
/// bindings do), giving up at `deadline`.
fn wait<F: Future>(
    deadline: Option<Instant>,
    during: &'static str,
    wait: F,
) -> wasmtime::Result<F::Output> {
    wasmtime_wasi::runtime::in_tokio(async move {
        match deadline {
            None => Ok(wait.await),
            Some(deadline) => {
                tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), wait)
                    .await
                    .map_err(|_| wasmtime::Error::new(DeadlineExceeded { during }))
            }
        }
    })
}

/// As [`wait`], for a stream method whose own result is a [`StreamResult`].
fn wait_stream<T>(
    deadline: Option<Instant>,
    during: &'static str,
    op: impl Future<Output = StreamResult<T>>,
) -> StreamResult<T> {
    wait(deadline, during, op).map_err(StreamError::Trap)?
}

/// What the store's `wasi:io` sees: its resources and the call's deadline.
pub(crate) struct DeadlineIo<'a> {
    table: &'a mut ResourceTable,
    deadline: Option<Instant>,
}

struct HasDeadlineIo;

impl HasData for HasDeadlineIo {
    type Data<'a> = DeadlineIo<'a>;
}

/// Replaces wasmtime-wasi's `wasi:io/poll` and `wasi:io/streams` in `linker`
/// (already holding them, from `add_to_linker_sync`) by the versions bounded
/// by the call's deadline.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    fn io(state: &mut HostState) -> DeadlineIo<'_> {
        DeadlineIo {
            table: &mut state.table,
            deadline: state.deadline,
        }
    }
    linker.allow_shadowing(true);
    let linked = poll::add_to_linker::<HostState, HasDeadlineIo>(linker, io)
        .and_then(|()| streams::add_to_linker::<HostState, HasDeadlineIo>(linker, io));
    linker.allow_shadowing(false);
    linked
}

impl poll::Host for DeadlineIo<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        wait(
            self.deadline,
            "wasi:io/poll.poll",
            AsyncPoll::poll(&mut *self.table, pollables),
        )?
    }
}

impl poll::HostPollable for DeadlineIo<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        poll::HostPollable::ready(&mut *self.table, pollable)
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        wait(
            self.deadline,
            "wasi:io/poll.pollable.block",
            AsyncPollable::block(&mut *self.table, pollable),
        )?
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        poll::HostPollable::drop(&mut *self.table, pollable)
    }
}

impl streams::Host for DeadlineIo<'_> {
    fn convert_stream_error(&mut self, err: StreamError) -> wasmtime::Result<streams::StreamError> {
        streams::Host::convert_stream_error(&mut *self.table, err)
    }
}

impl streams::HostOutputStream for DeadlineIo<'_> {
    fn drop(&mut self, stream: Resource<DynOutputStream>) -> wasmtime::Result<()> {
        // Dropping waits for the stream's last write to finish.
        wait(
            self.deadline,
            "wasi:io/streams.output-stream.drop",
            AsyncOutput::drop(&mut *self.table, stream),
        )?
    }

    fn check_write(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<u64> {
        streams::HostOutputStream::check_write(&mut *self.table, stream)
    }

    fn write(&mut self, stream: Resource<DynOutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
        streams::HostOutputStream::write(&mut *self.table, stream, bytes)
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        wait_stream(
            self.deadline,
            "wasi:io/streams.output-stream.blocking-write-and-flush",
            AsyncOutput::blocking_write_and_flush(&mut *self.table, stream, bytes),
        )
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        wait_stream(
            self.deadline,
            "wasi:io/streams.output-stream.blocking-write-zeroes-and-flush",
            AsyncOutput::blocking_write_zeroes_and_flush(&mut *self.table, stream, len),
        )
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostOutputStream::subscribe(&mut *self.table, stream)
    }

    fn write_zeroes(&mut self, stream: Resource<DynOutputStream>, len: u64) -> StreamResult<()> {
        streams::HostOutputStream::write_zeroes(&mut *self.table, stream, len)
    }

    fn flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        streams::HostOutputStream::flush(&mut *self.table, stream)
    }

    fn blocking_flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        wait_stream(
            self.deadline,
            "wasi:io/streams.output-stream.blocking-flush",
            AsyncOutput::blocking_flush(&mut *self.table, stream),
        )
    }

    fn splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        streams::HostOutputStream::splice(&mut *self.table, dst, src, len)
    }

    fn blocking_splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        wait_stream(
            self.deadline,
            "wasi:io/streams.output-stream.blocking-splice",
            AsyncOutput::blocking_splice(&mut *self.table, dst, src, len),
        )
    }
}

impl streams::HostInputStream for DeadlineIo<'_> {
    fn drop(&mut self, stream: Resource<DynInputStream>) -> wasmtime::Result<()> {
        wait(
            self.deadline,
            "wasi:io/streams.input-stream.drop",
            AsyncInput::drop(&mut *self.table, stream),
        )?
    }

    fn read(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<Vec<u8>> {
        streams::HostInputStream::read(&mut *self.table, stream, len)
    }

    fn blocking_read(
        &mut self,
        stream: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<Vec<u8>> {
        wait_stream(
            self.deadline,
            "wasi:io/streams.input-stream.blocking-read",
            AsyncInput::blocking_read(&mut *self.table, stream, len),
        )
    }

    fn skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        streams::HostInputStream::skip(&mut *self.table, stream, len)
    }

    fn blocking_skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        wait_stream(
            self.deadline,
            "wasi:io/streams.input-stream.blocking-skip",
            AsyncInput::blocking_skip(&mut *self.table, stream, len),
        )
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynInputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostInputStream::subscribe(&mut *self.table, stream)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_wait_gives_up_at_the_deadline_and_says_where() {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(100);
        let err = wait(
            deadline.into(),
            "a test's sleep",
            std::future::pending::<()>(),
        )
        .expect_err("never ready");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(started.elapsed() >= Duration::from_millis(100));
        let exceeded = err.downcast_ref::<DeadlineExceeded>().expect("typed");
        assert_eq!(exceeded.during, "a test's sleep");
        assert_eq!(
            err.to_string(),
            "the time limit passed while the plugin waited in a test's sleep"
        );
        // What is ready before the deadline is returned, even at the deadline.
        assert_eq!(wait(Some(Instant::now()), "ready", async { 7 }).unwrap(), 7);
        assert_eq!(wait(None, "no deadline", async { 8 }).unwrap(), 8);
    }

    #[test]
    fn check_fails_only_after_the_deadline() {
        assert!(check(None, "x").is_ok());
        assert!(check(Some(Instant::now() + Duration::from_secs(60)), "x").is_ok());
        let err = check(Some(Instant::now()), "keyed-state.get").expect_err("passed");
        assert!(err.downcast_ref::<DeadlineExceeded>().is_some());
    }
}
