//! A plugin's logs, the `log` import and its stderr, forwarded to the host's
//! log with a cap.
//!
//! Both are the plugin's to fill: a loop of `log` calls, or a `write_all` of
//! 64 MiB to stderr, would flood the host's log, and a buffer kept for stderr
//! would fill the host's memory (wasmtime-wasi's `MemoryOutputPipe` instead
//! fails every write once full, which made a chatty plugin trap). So in one
//! call (a `process` or `write-batch`, or instantiation with `open`) a plugin
//! may log at most [`MAX_MESSAGES`] messages and [`MAX_BYTES`] bytes, its
//! stderr lines included, each message cut at [`MAX_MESSAGE_BYTES`]; what is
//! over is dropped and counted, and one warning at the end of the call says
//! how much. Messages at a level the host's log leaves out cost nothing and
//! count for nothing.
//!
//! Stderr always takes what it is given and never blocks. Besides the log,
//! the last [`TAIL_BYTES`] bytes of the call are kept for the error of a
//! trap: a panic message is the last thing a plugin writes.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Messages a plugin may log in one call.
pub(crate) const MAX_MESSAGES: u32 = 1_000;
/// Bytes of messages a plugin may log in one call.
pub(crate) const MAX_BYTES: usize = 1 << 20;
/// The longest message forwarded whole; longer ones are cut.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 << 10;
/// The end of a call's stderr kept for the error of a trap.
pub(crate) const TAIL_BYTES: usize = 16 << 10;

/// Severity of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// The logs of one plugin instance, shared by its store (the `log` import)
/// and its stderr stream.
#[derive(Debug, Clone)]
pub(crate) struct PluginLog {
    inner: Arc<Mutex<LogState>>,
}

#[derive(Debug)]
struct LogState {
    plugin: Arc<str>,
    batch_id: u64,
    /// Messages and bytes forwarded in this call.
    messages: u32,
    bytes: usize,
    /// Messages dropped whole, and bytes dropped or cut, in this call.
    dropped_messages: u64,
    dropped_bytes: u64,
    /// The stderr line being written, up to [`MAX_MESSAGE_BYTES`].
    line: Vec<u8>,
    /// Bytes of the current stderr line past what `line` keeps.
    line_cut: u64,
    /// This call's stderr, of which the last [`TAIL_BYTES`] count (it is
    /// cut back to those when it reaches twice as many).
    tail: Vec<u8>,
}

fn enabled(level: Level) -> bool {
    match level {
        Level::Trace => tracing::enabled!(tracing::Level::TRACE),
        Level::Debug => tracing::enabled!(tracing::Level::DEBUG),
        Level::Info => tracing::enabled!(tracing::Level::INFO),
        Level::Warn => tracing::enabled!(tracing::Level::WARN),
        Level::Error => tracing::enabled!(tracing::Level::ERROR),
    }
}

/// Where a message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Log,
    Stderr,
}

fn emit(plugin: &str, batch_id: u64, level: Level, source: Source, message: &str) {
    if source == Source::Stderr {
        tracing::info!(plugin, batch_id, "stderr: {message}");
        return;
    }
    match level {
        Level::Trace => tracing::trace!(plugin, batch_id, "{message}"),
        Level::Debug => tracing::debug!(plugin, batch_id, "{message}"),
        Level::Info => tracing::info!(plugin, batch_id, "{message}"),
        Level::Warn => tracing::warn!(plugin, batch_id, "{message}"),
        Level::Error => tracing::error!(plugin, batch_id, "{message}"),
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl LogState {
    /// Forwards `message` if the call's budget allows, cut to what is left.
    fn message(&mut self, level: Level, source: Source, message: &str, extra_cut: u64) {
        if !enabled(level) {
            return;
        }
        let left = MAX_BYTES.saturating_sub(self.bytes);
        if self.messages >= MAX_MESSAGES || left == 0 {
            self.dropped_messages += 1;
            self.dropped_bytes += message.len() as u64 + extra_cut;
            return;
        }
        let kept = prefix(message, left.min(MAX_MESSAGE_BYTES));
        let cut = (message.len() - kept.len()) as u64 + extra_cut;
        self.messages += 1;
        self.bytes += kept.len();
        if cut == 0 {
            emit(&self.plugin, self.batch_id, level, source, kept);
        } else {
            self.dropped_bytes += cut;
            let message = format!("{kept}… ({cut} more bytes cut)");
            emit(&self.plugin, self.batch_id, level, source, &message);
        }
    }

    /// Takes `bytes` written to stderr: complete lines go to the log.
    fn stderr(&mut self, mut bytes: &[u8]) {
        let keep = bytes.len().min(TAIL_BYTES);
        self.tail.extend_from_slice(&bytes[bytes.len() - keep..]);
        if self.tail.len() >= 2 * TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
        while !bytes.is_empty() {
            let (chunk, newline) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..i], true),
                None => (bytes, false),
            };
            let room = MAX_MESSAGE_BYTES.saturating_sub(self.line.len());
            let taken = chunk.len().min(room);
            self.line.extend_from_slice(&chunk[..taken]);
            self.line_cut += (chunk.len() - taken) as u64;
            bytes = &bytes[chunk.len() + usize::from(newline)..];
            if newline {
                self.flush_line();
            }
        }
    }

    /// Logs the stderr line written so far, if any.
    fn flush_line(&mut self) {
        if self.line.is_empty() && self.line_cut == 0 {
            return;
        }
        let line = std::mem::take(&mut self.line);
        let cut = std::mem::take(&mut self.line_cut);
        let text = String::from_utf8_lossy(&line);
        self.message(Level::Info, Source::Stderr, text.trim_end(), cut);
        // Keep the allocation for the next line.
        self.line = line;
        self.line.clear();
    }
}

impl PluginLog {
    pub(crate) fn new(plugin: Arc<str>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(LogState {
                plugin,
                batch_id: 0,
                messages: 0,
                bytes: 0,
                dropped_messages: 0,
                dropped_bytes: 0,
                line: Vec::new(),
                line_cut: 0,
                tail: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a call (or instantiation): a fresh budget and stderr tail.
    pub(crate) fn begin(&self, batch_id: u64) {
        let mut state = self.lock();
        state.batch_id = batch_id;
        state.messages = 0;
        state.bytes = 0;
        state.dropped_messages = 0;
        state.dropped_bytes = 0;
        state.line.clear();
        state.line_cut = 0;
        state.tail.clear();
    }

    /// Ends a call: logs an unfinished stderr line, and says once what was dropped.
    pub(crate) fn end(&self) {
        let mut state = self.lock();
        state.flush_line();
        if state.dropped_messages > 0 || state.dropped_bytes > 0 {
            let (plugin, batch_id) = (Arc::clone(&state.plugin), state.batch_id);
            let (messages, bytes) = (state.dropped_messages, state.dropped_bytes);
            tracing::warn!(
                plugin = &*plugin,
                batch_id,
                dropped_messages = messages,
                dropped_bytes = bytes,
                "the plugin logged more than {MAX_MESSAGES} messages or {MAX_BYTES} bytes in one \
                 call (stderr included, a message cut at {MAX_MESSAGE_BYTES} bytes): dropped \
                 {messages} messages and {bytes} bytes"
            );
            state.dropped_messages = 0;
            state.dropped_bytes = 0;
        }
    }

    /// A message of the `log` import.
    pub(crate) fn message(&self, level: Level, message: &str) {
        self.lock().message(level, Source::Log, message, 0);
    }

    /// The end of this call's stderr, for the error of a trap.
    pub(crate) fn stderr_tail(&self) -> String {
        let state = self.lock();
        let tail = &state.tail[state.tail.len().saturating_sub(TAIL_BYTES)..];
        String::from_utf8_lossy(tail).trim().to_owned()
    }

    /// What the plugin's WASI context writes stderr to.
    pub(crate) fn stderr(&self) -> Stderr {
        Stderr { log: self.clone() }
    }
}

/// A plugin's stderr: into its [`PluginLog`], never full, never blocking.
#[derive(Debug, Clone)]
pub(crate) struct Stderr {
    log: PluginLog,
}

/// What `check-write` grants at a time; any amount is taken.
const WRITE_PERMIT: usize = 1 << 20;

impl IsTerminal for Stderr {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Stderr {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Stderr {
    async fn ready(&mut self) {}
}

impl OutputStream for Stderr {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.log.lock().stderr(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for Stderr {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.log.lock().stderr(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    /// Everything the log writes, in one buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;

        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    /// Runs `f` with the log at `level` captured; returns its lines.
    fn capture(level: tracing::Level, f: impl FnOnce()) -> Vec<String> {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_flood_of_messages_is_capped_per_call_and_the_drop_is_said_once() {
        let log = PluginLog::new("chatty".into());
        let lines = capture(tracing::Level::INFO, || {
            log.begin(7);
            for i in 0..5_000 {
                log.message(Level::Info, &format!("message {i}"));
                // Below the log's level: neither forwarded nor counted.
                log.message(Level::Debug, "debug detail");
            }
            log.end();
            // The next call has a budget of its own.
            log.begin(8);
            log.message(Level::Warn, "the next call");
            log.end();
        });
        let forwarded = lines
            .iter()
            .filter(|l| l.contains("message ") && !l.contains("dropped"))
            .count();
        assert_eq!(forwarded, MAX_MESSAGES as usize);
        assert!(lines.iter().all(|l| !l.contains("debug detail")));
        let drops: Vec<&String> = lines.iter().filter(|l| l.contains("dropped")).collect();
        assert_eq!(drops.len(), 1, "{drops:?}");
        assert!(drops[0].contains("plugin=\"chatty\""), "{}", drops[0]);
        assert!(drops[0].contains("batch_id=7"), "{}", drops[0]);
        assert!(drops[0].contains("dropped 4000 messages"), "{}", drops[0]);
        assert!(lines.last().unwrap().contains("the next call"));
    }

    #[test]
    fn bytes_are_capped_per_call_and_a_huge_message_is_cut() {
        let log = PluginLog::new("p".into());
        let huge = "é".repeat(MAX_BYTES);
        let lines = capture(tracing::Level::INFO, || {
            log.begin(0);
            for _ in 0..100 {
                log.message(Level::Error, &huge);
            }
            log.end();
        });
        let total: usize = lines.iter().map(String::len).sum();
        assert!(total < 2 * MAX_BYTES, "{total}");
        let cut: Vec<&String> = lines.iter().filter(|l| l.contains("bytes cut")).collect();
        assert_eq!(cut.len(), MAX_BYTES / MAX_MESSAGE_BYTES);
        assert!(cut[0].contains(&format!(
            "({} more bytes cut)",
            2 * MAX_BYTES - MAX_MESSAGE_BYTES
        )));
        let last = lines.last().unwrap();
        assert!(
            last.contains(&format!(
                "dropped {} messages",
                100 - MAX_BYTES / MAX_MESSAGE_BYTES
            )),
            "{last}"
        );
    }

    #[test]
    fn stderr_takes_anything_logs_lines_and_keeps_its_tail() {
        let log = PluginLog::new("noisy".into());
        let mut stderr = log.stderr();
        let chunk = bytes::Bytes::from(vec![b'x'; 4096]);
        let lines = capture(tracing::Level::INFO, || {
            log.begin(3);
            stderr
                .write(bytes::Bytes::from_static(b"first line\nsecond "))
                .unwrap();
            stderr.write(bytes::Bytes::from_static(b"line\n")).unwrap();
            // 64 MiB with no newline: never full, cut into one message.
            for _ in 0..(64 << 20) / chunk.len() {
                assert_eq!(stderr.check_write().unwrap(), WRITE_PERMIT);
                stderr.write(chunk.clone()).unwrap();
            }
            stderr
                .write(bytes::Bytes::from_static(b"\npanicked at the end\n"))
                .unwrap();
            assert!(log.stderr_tail().ends_with("panicked at the end"));
            assert!(log.stderr_tail().len() <= TAIL_BYTES);
            log.end();
        });
        assert!(lines[0].contains("stderr: first line"), "{}", lines[0]);
        assert!(lines[1].contains("stderr: second line"), "{}", lines[1]);
        assert!(
            lines[2].contains(&format!(
                "({} more bytes cut)",
                (64 << 20) - MAX_MESSAGE_BYTES
            )),
            "{}",
            &lines[2][lines[2].len() - 100..]
        );
        assert!(lines[3].contains("stderr: panicked at the end"));
        assert_eq!(lines.len(), 5, "and one line about the drop");
        // A new call starts a new tail.
        log.begin(4);
        assert_eq!(log.stderr_tail(), "");
    }
}
