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
//! (GETs `http://{address}/` over wasi:http and adds the response body).
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
            "http" => vec![Column::utf8_from_iter("http", std::iter::empty())],
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
            "http" => {
                let address = self.config.address.as_deref().unwrap_or("127.0.0.1:9");
                let body = wasi_io::http_get(address).map_err(|e| {
                    PluginError::fatal(format!("HTTP GET http://{address}/ failed: {e}"))
                })?;
                Ok(Output::edit()
                    .set_column(Column::utf8_from_iter(
                        "http",
                        (0..batch.num_rows()).map(|_| Some(body.as_str())),
                    ))
                    .into())
            }
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

    pub fn http_get(authority: &str) -> Result<String, String> {
        let request = OutgoingRequest::new(Fields::new());
        request
            .set_scheme(Some(&Scheme::Http))
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

    pub fn http_get(_authority: &str) -> Result<String, String> {
        Err("wasi:http exists only in a Wasm guest".into())
    }
}

weir_plugin_sdk::export_transform!(Hostile);
