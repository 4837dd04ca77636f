//! A transform that breaks the rules on purpose, so that tests can prove the
//! host contains it: it traps, loops, allocates without bound, reaches for
//! files and the network it was not granted, or returns a malformed batch.
//!
//! Config: `{ "mode": "trap", "batch": 1 }` — misbehave as `mode` says, in
//! batch `batch` only when given (other batches pass through unchanged).
//! Modes: `ok`, `trap`, `loop`, `alloc`, `read-file`, `connect`,
//! `bad-output` (a column one value short), `bad-type` (a column of the wrong
//! type), `error`, `retryable`, `random`, `replay` (adds what it reads of the
//! clocks and random sources), `env` (adds the environment it sees), `http`
//! (GETs `http://{address}/` over wasi:http and adds the response body),
//! `https` (the same over TLS), `sleep` (waits on a monotonic-clock pollable
//! of `u64::MAX` ns: forever).
//!
//! Output that lies about itself, to prove it cannot crash the host: each
//! `ipc-*` mode returns the host's own Arrow IPC stream of the batch with one
//! field of its flatbuffer metadata overwritten: `ipc-huge-body` (the record
//! batch announces a 2^62-byte body), `ipc-negative-body` (a body of -8
//! bytes), `ipc-unknown-type` (column 0's type is 99), `ipc-bad-bit-width`
//! (column 0, an int64, has bit width 7), `ipc-decimal-scale-90` (`amount`,
//! a DECIMAL(12,2), has scale 90). `decimal-scale-90` sets `amount` as a typed
//! column declared decimal128(38, 90); `declare-decimal-scale-90` declares an
//! output column of that type when it opens.
//!
//! Floods, to prove the host caps what it keeps for a plugin: `log-spam`
//! (100,000 `log` messages of 1 KiB, then one of 4 MiB), `stderr-spam`
//! (64 MiB to stderr in lines of 1 KiB), `resources` (monotonic-clock
//! pollables, opened and never dropped, without end).
//!
//! Without `mode` it passes every batch through and takes (and ignores)
//! `filter_rows`' keys `column`, `op` and `value`: it then stands in as
//! another build of `filter_rows` (the hot-replacement tests swap it in).

use serde::Deserialize;
use serde::de::IgnoredAny;
use weir_plugin_sdk::{
    Batch, BatchInfo, Bitmap, Column, Output, PluginError, Schema, Selection, Transform,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "pass_through")]
    pub mode: String,
    /// `filter_rows`' keys, ignored.
    #[serde(default)]
    pub column: Option<IgnoredAny>,
    #[serde(default)]
    pub op: Option<IgnoredAny>,
    #[serde(default)]
    pub value: Option<IgnoredAny>,
    #[serde(default)]
    pub batch: Option<u64>,
    /// For `connect`: where to connect.
    #[serde(default)]
    pub address: Option<String>,
    /// For `read-file`: what to read.
    #[serde(default)]
    pub file: Option<String>,
}

fn pass_through() -> String {
    "ok".to_owned()
}

#[derive(Debug)]
pub struct Hostile {
    config: Config,
}

impl Transform for Hostile {
    type Config = Config;

    fn new(config: Config, input: &Schema) -> Result<Self, PluginError> {
        let known = [
            "ok",
            "trap",
            "loop",
            "alloc",
            "read-file",
            "connect",
            "bad-output",
            "bad-type",
            "error",
            "retryable",
            "random",
            "replay",
            "env",
            "http",
            "ipc-huge-body",
            "ipc-negative-body",
            "ipc-unknown-type",
            "ipc-bad-bit-width",
            "ipc-decimal-scale-90",
            "decimal-scale-90",
            "declare-decimal-scale-90",
            "https",
            "sleep",
            "log-spam",
            "stderr-spam",
            "resources",
        ];
        if !known.contains(&config.mode.as_str()) {
            return Err(PluginError::invalid_config(format!(
                "mode {:?} is not one of {known:?}",
                config.mode
            )));
        }
        if config.mode == "random" && input.index_of("random").is_some() {
            return Err(PluginError::invalid_input(
                "the input already has a column `random`",
            ));
        }
        Ok(Self { config })
    }

    fn output_schema(&self, input: &Schema) -> Result<Schema, PluginError> {
        let mut schema = input.clone();
        let added: Vec<Column> = match self.config.mode.as_str() {
            "random" => vec![Column::int64("random", Vec::new(), None)],
            "replay" => vec![
                Column::int64("wall_micros", Vec::new(), None),
                Column::int64("monotonic_nanos", Vec::new(), None),
                Column::int64("random", Vec::new(), None),
                Column::int64("wasi_random", Vec::new(), None),
                Column::int64("wasi_insecure", Vec::new(), None),
            ],
            "env" => vec![Column::utf8_from_iter("env", std::iter::empty())],
            "http" | "https" => vec![Column::utf8_from_iter("http", std::iter::empty())],
            "declare-decimal-scale-90" => {
                vec![Column::decimal128("tiny", 38, 90, Vec::new(), None)]
            }
            _ => vec![],
        };
        for column in added {
            schema = schema.with_field(column.field());
        }
        Ok(schema)
    }

    fn process(&mut self, batch: &Batch<'_>, info: &BatchInfo) -> Result<Output, PluginError> {
        if self.config.batch.is_some_and(|b| b != info.batch_id) {
            return Ok(Output::unchanged());
        }
        match self.config.mode.as_str() {
            "trap" => panic!(
                "hostile plugin: panicking on purpose in batch {}",
                info.batch_id
            ),
            "loop" => {
                let mut x: u64 = info.batch_id;
                loop {
                    x = std::hint::black_box(
                        x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                    );
                }
            }
            "alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 8 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "read-file" => {
                let file = self.config.file.as_deref().unwrap_or("/etc/passwd");
                match std::fs::read_to_string(file) {
                    Ok(text) => Err(PluginError::fatal(format!(
                        "read {file}: got {} bytes",
                        text.len()
                    ))),
                    Err(e) => Err(PluginError::fatal(format!("cannot read {file}: {e}"))),
                }
            }
            "connect" => {
                let address = self.config.address.as_deref().unwrap_or("127.0.0.1:9");
                match std::net::TcpStream::connect(address) {
                    Ok(_) => Err(PluginError::fatal(format!("connected to {address}"))),
                    Err(e) => Err(PluginError::fatal(format!(
                        "cannot connect to {address}: {e}"
                    ))),
                }
            }
            "bad-output" => {
                // One value too few for the batch.
                let rows = batch.num_rows().saturating_sub(1);
                Ok(Output::edit()
                    .set_column(Column::int64("order_id", vec![0; rows], None))
                    .into())
            }
            "bad-type" => {
                // The right length, the wrong type: `order_id` is declared BIGINT.
                let rows = batch.num_rows();
                Ok(Output::edit()
                    .set_column(Column::utf8_from_iter(
                        "order_id",
                        (0..rows).map(|_| Some("not a number")),
                    ))
                    .into())
            }
            "replay" => {
                let rows = batch.num_rows();
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(-1, |d| d.as_micros() as i64);
                let mut edit = Output::edit()
                    .set_column(Column::int64("wall_micros", vec![wall; rows], None))
                    .set_column(Column::int64(
                        "monotonic_nanos",
                        vec![wasi_io::monotonic_nanos(); rows],
                        None,
                    ));
                let host: Vec<i64> = (0..rows)
                    .map(|_| weir_plugin_sdk::random_u64() as i64)
                    .collect();
                let secure: Vec<i64> = (0..rows).map(|_| wasi_io::random_u64() as i64).collect();
                let insecure: Vec<i64> = (0..rows)
                    .map(|_| wasi_io::insecure_random_u64() as i64)
                    .collect();
                edit = edit
                    .set_column(Column::int64("random", host, None))
                    .set_column(Column::int64("wasi_random", secure, None))
                    .set_column(Column::int64("wasi_insecure", insecure, None));
                Ok(edit.into())
            }
            "env" => {
                let mut vars: Vec<String> =
                    std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                vars.sort();
                let text = vars.join(";");
                Ok(Output::edit()
                    .set_column(Column::utf8_from_iter(
                        "env",
                        (0..batch.num_rows()).map(|_| Some(text.as_str())),
                    ))
                    .into())
            }
            "sleep" => {
                wasi_io::sleep_forever();
                Err(PluginError::fatal(
                    "hostile plugin: woke up from an endless sleep",
                ))
            }
            "http" | "https" => {
                let address = self.config.address.as_deref().unwrap_or("127.0.0.1:9");
                let tls = self.config.mode == "https";
                let body = wasi_io::http_get(address, tls).map_err(|e| {
                    let scheme = if tls { "https" } else { "http" };
                    PluginError::fatal(format!("HTTP GET {scheme}://{address}/ failed: {e}"))
                })?;
                Ok(Output::edit()
                    .set_column(Column::utf8_from_iter(
                        "http",
                        (0..batch.num_rows()).map(|_| Some(body.as_str())),
                    ))
                    .into())
            }
            "ipc-huge-body"
            | "ipc-negative-body"
            | "ipc-unknown-type"
            | "ipc-bad-bit-width"
            | "ipc-decimal-scale-90" => {
                let mut bytes = batch.to_ipc()?;
                ipc_patch::apply(&mut bytes, &self.config.mode).map_err(|e| {
                    PluginError::fatal(format!("hostile plugin: cannot patch the IPC stream: {e}"))
                })?;
                Ok(Output::ipc(bytes))
            }
            "decimal-scale-90" => {
                let rows = batch.num_rows();
                Ok(Output::edit()
                    .set_column(Column::decimal128("amount", 38, 90, vec![0; rows], None))
                    .into())
            }
            "log-spam" => {
                let line = "x".repeat(1 << 10);
                for i in 0..100_000 {
                    weir_plugin_sdk::log_info(&format!("spam {i}: {line}"));
                }
                weir_plugin_sdk::log_info(&"y".repeat(4 << 20));
                Ok(Output::unchanged())
            }
            "stderr-spam" => {
                use std::io::Write;
                let mut line = vec![b'z'; (1 << 10) - 1];
                line.push(b'\n');
                let mut stderr = std::io::stderr().lock();
                for _ in 0..(64 << 20) / line.len() {
                    stderr.write_all(&line).map_err(|e| {
                        PluginError::fatal(format!("hostile plugin: stderr refused a line: {e}"))
                    })?;
                }
                Ok(Output::unchanged())
            }
            "resources" => Err(PluginError::fatal(format!(
                "hostile plugin: the host let it hold {} pollables",
                wasi_io::hoard_pollables()
            ))),
            "error" => Err(PluginError::fatal("hostile plugin: refusing this batch").at_row(3)),
            "retryable" => Err(PluginError::retryable("hostile plugin: try again later")),
            "random" => {
                let values = (0..batch.num_rows())
                    .map(|_| weir_plugin_sdk::random_u64() as i64)
                    .collect();
                Ok(Output::edit()
                    .set_column(Column::int64("random", values, None))
                    .into())
            }
            _ => Ok(Output::keep(Selection::mask(Bitmap::new_set(
                batch.num_rows(),
            )))),
        }
    }
}

/// Overwrites one field of an Arrow IPC stream's flatbuffer metadata, found
/// by walking the tables by hand (the plugin carries no Arrow library).
/// Field slots are numbered as in Arrow's `Message.fbs` and `Schema.fbs`.
mod ipc_patch {
    /// `Message`: `header` and `bodyLength`.
    const MESSAGE_HEADER: usize = 2;
    const MESSAGE_BODY_LENGTH: usize = 3;
    /// `Schema.fields`.
    const SCHEMA_FIELDS: usize = 1;
    /// `Field`: `type_type` and `type`.
    const FIELD_TYPE_TYPE: usize = 2;
    const FIELD_TYPE: usize = 3;
    /// `Int.bitWidth`, `Decimal.scale`.
    const INT_BIT_WIDTH: usize = 0;
    const DECIMAL_SCALE: usize = 1;
    /// The `Type` union's tag of `Decimal`.
    const TYPE_DECIMAL: u8 = 7;

    /// Applies `mode`'s lie to `bytes`, the host's IPC stream of a batch.
    pub fn apply(bytes: &mut [u8], mode: &str) -> Result<(), String> {
        let messages = messages(bytes)?;
        let (schema, batch) = match messages.as_slice() {
            [schema, batch, ..] => (schema.clone(), batch.clone()),
            _ => {
                return Err(format!(
                    "{} messages, not a schema and a batch",
                    messages.len()
                ));
            }
        };
        match mode {
            "ipc-huge-body" => body_length(&mut bytes[batch], 1 << 62),
            "ipc-negative-body" => body_length(&mut bytes[batch], -8),
            "ipc-unknown-type" => {
                let meta = &mut bytes[schema];
                let at = slot(meta, field(meta, 0)?, FIELD_TYPE_TYPE)?;
                write(meta, at, &[99])
            }
            "ipc-bad-bit-width" => {
                let meta = &mut bytes[schema];
                let int = follow(meta, slot(meta, field(meta, 0)?, FIELD_TYPE)?)?;
                let at = slot(meta, int, INT_BIT_WIDTH)?;
                write(meta, at, &7i32.to_le_bytes())
            }
            "ipc-decimal-scale-90" => {
                let meta = &mut bytes[schema];
                for i in 0..fields(meta)?.1 {
                    let field = field(meta, i)?;
                    if read::<1>(meta, slot(meta, field, FIELD_TYPE_TYPE)?)? == [TYPE_DECIMAL] {
                        let decimal = follow(meta, slot(meta, field, FIELD_TYPE)?)?;
                        let at = slot(meta, decimal, DECIMAL_SCALE)?;
                        return write(meta, at, &90i32.to_le_bytes());
                    }
                }
                Err("no decimal column".into())
            }
            other => Err(format!("no IPC patch for mode {other:?}")),
        }
    }

    /// Where each message's metadata lies in `bytes`.
    fn messages(bytes: &[u8]) -> Result<Vec<std::ops::Range<usize>>, String> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            if read::<4>(bytes, pos)? != [0xff; 4] {
                return Err(format!("no continuation marker at byte {pos}"));
            }
            let len = usize::try_from(i32::from_le_bytes(read::<4>(bytes, pos + 4)?))
                .map_err(|e| e.to_string())?;
            if len == 0 {
                break;
            }
            let meta = bytes
                .get(pos + 8..pos + 8 + len)
                .ok_or("metadata past the end")?;
            let body = match slot(meta, follow(meta, 0)?, MESSAGE_BODY_LENGTH) {
                Ok(at) => i64::from_le_bytes(read::<8>(meta, at)?),
                Err(_) => 0,
            };
            out.push(pos + 8..pos + 8 + len);
            pos += 8 + len + usize::try_from(body).map_err(|e| e.to_string())?;
        }
        Ok(out)
    }

    fn body_length(meta: &mut [u8], value: i64) -> Result<(), String> {
        let at = slot(meta, follow(meta, 0)?, MESSAGE_BODY_LENGTH)?;
        write(meta, at, &value.to_le_bytes())
    }

    /// The schema's field vector and its length.
    fn fields(meta: &[u8]) -> Result<(usize, usize), String> {
        let schema = follow(meta, slot(meta, follow(meta, 0)?, MESSAGE_HEADER)?)?;
        let fields = follow(meta, slot(meta, schema, SCHEMA_FIELDS)?)?;
        let count = u32::from_le_bytes(read::<4>(meta, fields)?);
        Ok((fields, usize::try_from(count).map_err(|e| e.to_string())?))
    }

    /// The table of field `index` of a schema message.
    fn field(meta: &[u8], index: usize) -> Result<usize, String> {
        let (fields, count) = fields(meta)?;
        if index >= count {
            return Err(format!("the schema has {count} fields"));
        }
        follow(meta, fields + 4 + 4 * index)
    }

    /// Where field slot `id` of the table at `table` lives.
    fn slot(meta: &[u8], table: usize, id: usize) -> Result<usize, String> {
        let soffset = i32::from_le_bytes(read::<4>(meta, table)?);
        let vtable = i64::try_from(table).map_err(|e| e.to_string())? - i64::from(soffset);
        let vtable = usize::try_from(vtable).map_err(|e| e.to_string())?;
        let size = u16::from_le_bytes(read::<2>(meta, vtable)?);
        let entry = 4 + 2 * id;
        if entry + 2 > usize::from(size) {
            return Err(format!("slot {id} is absent"));
        }
        match u16::from_le_bytes(read::<2>(meta, vtable + entry)?) {
            0 => Err(format!("slot {id} is absent")),
            offset => Ok(table + usize::from(offset)),
        }
    }

    /// Where the offset stored at `at` points.
    fn follow(meta: &[u8], at: usize) -> Result<usize, String> {
        let offset = u32::from_le_bytes(read::<4>(meta, at)?);
        Ok(at + usize::try_from(offset).map_err(|e| e.to_string())?)
    }

    fn read<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], String> {
        bytes
            .get(at..at + N)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format!("byte {at} is past the end"))
    }

    fn write(bytes: &mut [u8], at: usize, value: &[u8]) -> Result<(), String> {
        bytes
            .get_mut(at..at + value.len())
            .ok_or_else(|| format!("byte {at} is past the end"))?
            .copy_from_slice(value);
        Ok(())
    }
}

/// The WASI interfaces std does not expose (the monotonic clock's value, the
/// random interfaces, wasi:http), called directly through the `wasip2` bindings.
#[cfg(target_arch = "wasm32")]
mod wasi_io {
    use std::io::Read;

    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};

    pub fn monotonic_nanos() -> i64 {
        wasip2::clocks::monotonic_clock::now() as i64
    }

    pub fn random_u64() -> u64 {
        wasip2::random::random::get_random_u64()
    }

    pub fn insecure_random_u64() -> u64 {
        wasip2::random::insecure::get_insecure_random_u64()
    }

    /// Opens pollables and keeps them all, until the host refuses one
    /// (a trap) or ten million are open.
    pub fn hoard_pollables() -> usize {
        let mut hoard = Vec::new();
        while hoard.len() < 10_000_000 {
            hoard.push(wasip2::clocks::monotonic_clock::subscribe_duration(0));
        }
        hoard.len()
    }

    /// Waits on a pollable that is never ready: a sleep of `u64::MAX` ns.
    pub fn sleep_forever() {
        let pollable = wasip2::clocks::monotonic_clock::subscribe_duration(u64::MAX);
        wasip2::io::poll::poll(&[&pollable]);
    }

    pub fn http_get(authority: &str, tls: bool) -> Result<String, String> {
        let request = OutgoingRequest::new(Fields::new());
        let scheme = if tls { Scheme::Https } else { Scheme::Http };
        request
            .set_scheme(Some(&scheme))
            .map_err(|()| "bad scheme".to_string())?;
        request
            .set_authority(Some(authority))
            .map_err(|()| format!("bad authority {authority:?}"))?;
        request
            .set_path_with_query(Some("/"))
            .map_err(|()| "bad path".to_string())?;
        let future = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
        future.subscribe().block();
        let response = match future.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(format!("{code:?}")),
            Some(Err(())) | None => return Err("no response".into()),
        };
        let status = response.status();
        let body = response
            .consume()
            .map_err(|()| "the body was taken".to_string())?;
        let mut text = String::new();
        body.stream()
            .map_err(|()| "the body stream was taken".to_string())?
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        Ok(format!("{status} {text}"))
    }
}

/// Native builds (the SDK's test harness) have no WASI to call.
#[cfg(not(target_arch = "wasm32"))]
mod wasi_io {
    pub fn monotonic_nanos() -> i64 {
        0
    }

    pub fn random_u64() -> u64 {
        0
    }

    pub fn insecure_random_u64() -> u64 {
        0
    }

    pub fn sleep_forever() {}

    pub fn hoard_pollables() -> usize {
        0
    }

    pub fn http_get(_authority: &str, _tls: bool) -> Result<String, String> {
        Err("wasi:http exists only in a Wasm guest".into())
    }
}

weir_plugin_sdk::export_transform!(Hostile);
