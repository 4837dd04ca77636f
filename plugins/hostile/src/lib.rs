//! A transform that breaks the rules on purpose, so that tests can prove the
//! host contains it: it traps, loops, allocates without bound, reaches for
//! files and the network it was not granted, or returns a malformed batch.
//!
//! Config: `{ "mode": "trap", "batch": 1 }` — misbehave as `mode` says, in
//! batch `batch` only when given (other batches pass through unchanged).
//! Modes: `ok`, `trap`, `loop`, `alloc`, `read-file`, `connect`,
//! `bad-output`, `error`, `retryable`, `random`.
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
            "error",
            "retryable",
            "random",
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
        if self.config.mode == "random" {
            let column = Column::int64("random", Vec::new(), None);
            return Ok(input.clone().with_field(column.field()));
        }
        Ok(input.clone())
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

weir_plugin_sdk::export_transform!(Hostile);
