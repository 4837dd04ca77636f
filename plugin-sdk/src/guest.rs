//! The wit-bindgen glue, compiled only for wasm32. It turns the generated WIT types into the SDK's
//! plain Rust types and back, and drives the author's [`Transform`] / [`Sink`] /
//! [`ScalarFunctions`], so that the export macros expand to a few lines in the plugin crate.
//!
//! [`Transform`]: crate::Transform
//! [`Sink`]: crate::Sink
//! [`ScalarFunctions`]: crate::ScalarFunctions
//!
//! One `generate!` per world, each behind its cargo feature: wit-bindgen embeds a component-type
//! section per `generate!`, and with `pub_export_macro` the exports half of it is emitted only by
//! the export macro the plugin invokes, so a component exports exactly its own world.

/// Conversions between one world's generated `types` and the SDK types. Each world gets its own
/// copy of the generated types, hence a macro rather than functions.
macro_rules! conversions {
    () => {
        use crate::batch::HostBatch;
        use crate::bitmap::Bitmap;
        use crate::column::{Column, Values};
        use crate::error::{ErrorKind, PluginError};
        use crate::schema::{DataType, Field, Schema};

        fn data_type_from_wit(d: wit::DataType) -> DataType {
            match d {
                wit::DataType::Boolean => DataType::Boolean,
                wit::DataType::Int32 => DataType::Int32,
                wit::DataType::Int64 => DataType::Int64,
                wit::DataType::Float64 => DataType::Float64,
                wit::DataType::Decimal128(t) => DataType::Decimal128 {
                    precision: t.precision,
                    scale: t.scale,
                },
                wit::DataType::Utf8 => DataType::Utf8,
                wit::DataType::TimestampMicros => DataType::TimestampMicros,
                wit::DataType::Date32 => DataType::Date32,
            }
        }

        #[allow(dead_code, reason = "the sink world never returns fields or columns")]
        fn data_type_to_wit(d: DataType) -> wit::DataType {
            match d {
                DataType::Boolean => wit::DataType::Boolean,
                DataType::Int32 => wit::DataType::Int32,
                DataType::Int64 => wit::DataType::Int64,
                DataType::Float64 => wit::DataType::Float64,
                DataType::Decimal128 { precision, scale } => {
                    wit::DataType::Decimal128(wit::DecimalType { precision, scale })
                }
                DataType::Utf8 => wit::DataType::Utf8,
                DataType::TimestampMicros => wit::DataType::TimestampMicros,
                DataType::Date32 => wit::DataType::Date32,
            }
        }

        fn schema_from_wit(fields: Vec<wit::Field>) -> Schema {
            Schema::new(
                fields
                    .into_iter()
                    .map(|f| Field {
                        name: f.name,
                        data_type: data_type_from_wit(f.data_type),
                        nullable: f.nullable,
                    })
                    .collect(),
            )
        }

        #[allow(dead_code, reason = "the sink world never returns fields")]
        fn schema_to_wit(schema: Schema) -> Vec<wit::Field> {
            schema
                .into_fields()
                .into_iter()
                .map(|f| wit::Field {
                    name: f.name,
                    data_type: data_type_to_wit(f.data_type),
                    nullable: f.nullable,
                })
                .collect()
        }

        fn column_from_wit(c: wit::Column, rows: usize) -> Column {
            let values = match c.values {
                wit::ColumnValues::Boolean(bytes) => {
                    Values::Boolean(Bitmap::from_bytes(bytes, rows))
                }
                wit::ColumnValues::Int32(v) => Values::Int32(v),
                wit::ColumnValues::Int64(v) => Values::Int64(v),
                wit::ColumnValues::Float64(v) => Values::Float64(v),
                wit::ColumnValues::Decimal128(bytes) => Values::Decimal128(
                    bytes
                        .chunks_exact(16)
                        .map(|b| {
                            let mut le = [0u8; 16];
                            le.copy_from_slice(b);
                            i128::from_le_bytes(le)
                        })
                        .collect(),
                ),
                wit::ColumnValues::Utf8(u) => Values::Utf8 {
                    offsets: u.offsets,
                    data: u.data,
                },
                wit::ColumnValues::TimestampMicros(v) => Values::TimestampMicros(v),
                wit::ColumnValues::Date32(v) => Values::Date32(v),
            };
            Column {
                name: c.name,
                data_type: data_type_from_wit(c.data_type),
                validity: c.validity.map(|v| Bitmap::from_bytes(v, rows)),
                values,
            }
        }

        #[allow(dead_code, reason = "the sink world never returns columns")]
        fn column_to_wit(c: Column) -> wit::Column {
            let values = match c.values {
                Values::Boolean(b) => wit::ColumnValues::Boolean(b.into_bytes()),
                Values::Int32(v) => wit::ColumnValues::Int32(v),
                Values::Int64(v) => wit::ColumnValues::Int64(v),
                Values::Float64(v) => wit::ColumnValues::Float64(v),
                Values::Decimal128(v) => {
                    wit::ColumnValues::Decimal128(v.iter().flat_map(|x| x.to_le_bytes()).collect())
                }
                Values::Utf8 { offsets, data } => {
                    wit::ColumnValues::Utf8(wit::Utf8Values { offsets, data })
                }
                Values::TimestampMicros(v) => wit::ColumnValues::TimestampMicros(v),
                Values::Date32(v) => wit::ColumnValues::Date32(v),
            };
            wit::Column {
                name: c.name,
                data_type: data_type_to_wit(c.data_type),
                validity: c.validity.map(Bitmap::into_bytes),
                values,
            }
        }

        fn error_to_wit(e: PluginError) -> wit::PluginError {
            wit::PluginError {
                kind: match e.kind {
                    ErrorKind::Fatal => wit::ErrorKind::Fatal,
                    ErrorKind::Retryable => wit::ErrorKind::Retryable,
                    ErrorKind::InvalidConfig => wit::ErrorKind::InvalidConfig,
                    ErrorKind::InvalidInput => wit::ErrorKind::InvalidInput,
                },
                message: e.message,
                row: e.row,
            }
        }

        fn info_from_wit(i: wit::BatchInfo) -> crate::batch::BatchInfo {
            crate::batch::BatchInfo {
                query_id: i.query_id,
                batch_id: i.batch_id,
                attempt: i.attempt,
                timestamp_micros: i.timestamp_micros,
                partition: i.partition,
            }
        }

        fn not_open() -> wit::PluginError {
            error_to_wit(PluginError::fatal(
                "the host called the plugin before `open` succeeded",
            ))
        }

        impl HostBatch for wit::Batch {
            fn num_rows(&self) -> u32 {
                wit::Batch::num_rows(self)
            }
            fn schema(&self) -> Schema {
                schema_from_wit(wit::Batch::schema(self))
            }
            fn column(&self, index: u32, rows: usize) -> Column {
                column_from_wit(wit::Batch::column(self, index), rows)
            }
            fn to_ipc(&self) -> Vec<u8> {
                wit::Batch::to_ipc(self)
            }
            #[cfg(feature = "merge-sink")]
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }
        }

        #[allow(
            dead_code,
            reason = "only transforms and merging sinks hand outputs back"
        )]
        pub(crate) fn output_to_wit(output: crate::output::Output) -> wit::TransformOutput {
            use crate::output::{Output, Selection};
            match output {
                Output::Edit(edit) => wit::TransformOutput::Edit(wit::Edit {
                    set_columns: edit.set_columns.into_iter().map(column_to_wit).collect(),
                    drop_columns: edit.drop_columns,
                    keep: edit.keep.map(|s| match s {
                        Selection::Mask(m) => wit::Selection::Mask(m.into_bytes()),
                        Selection::Indices(i) => wit::Selection::Indices(i),
                    }),
                }),
                Output::Ipc(bytes) => wit::TransformOutput::Ipc(bytes),
            }
        }

        /// The config string, as the generated trait names it.
        pub type WitString = String;
        /// A schema as the generated trait takes it.
        pub type WitFields = Vec<wit::Field>;
        /// Batch info as the generated trait takes it.
        pub type WitBatchInfo = wit::BatchInfo;
        /// The host's batch resource.
        pub type WitBatch = wit::Batch;
    };
}

/// The `transform` world, or `stateful-transform` with that feature.
#[cfg(feature = "transform")]
pub mod transform {
    /// Generated by wit-bindgen; the export macro is invoked by `export_transform!`.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unused_qualifications,
        reason = "generated"
    )]
    pub mod bindings {
        #[cfg(not(feature = "stateful-transform"))]
        wit_bindgen::generate!({
            world: "transform",
            path: "../wit",
            pub_export_macro: true,
            default_bindings_module: "weir_plugin_sdk::__private::transform::bindings",
            export_macro_name: "export_world",
        });
        // Same export (`transformer`), one more import (`keyed-state`): the
        // rest of this module serves both worlds unchanged.
        #[cfg(feature = "stateful-transform")]
        wit_bindgen::generate!({
            world: "stateful-transform",
            path: "../wit",
            pub_export_macro: true,
            default_bindings_module: "weir_plugin_sdk::__private::transform::bindings",
            export_macro_name: "export_world",
        });
    }

    use crate::Transform;
    use crate::batch::Batch;
    use bindings::weir::plugin::types as wit;

    pub use bindings::exports::weir::plugin::transformer::Guest;

    conversions!();

    /// What `open` returns.
    pub type OpenResult = Result<Vec<wit::Field>, wit::PluginError>;
    /// What `process` returns.
    pub type ProcessResult = Result<wit::TransformOutput, wit::PluginError>;

    /// `open`: parse the config, create the instance, return its output schema.
    pub fn open<T: Transform>(
        instance: &mut Option<T>,
        config: String,
        input_schema: Vec<wit::Field>,
    ) -> OpenResult {
        let input = schema_from_wit(input_schema);
        let config = crate::error::parse_config::<T::Config>(&config).map_err(error_to_wit)?;
        let transform = T::new(config, &input).map_err(error_to_wit)?;
        let output = transform.output_schema(&input).map_err(error_to_wit)?;
        *instance = Some(transform);
        Ok(schema_to_wit(output))
    }

    /// `process`: run the instance on the borrowed batch.
    pub fn process<T: Transform>(
        instance: &mut Option<T>,
        info: wit::BatchInfo,
        input: &wit::Batch,
    ) -> ProcessResult {
        let transform = instance.as_mut().ok_or_else(not_open)?;
        let batch = Batch::from_host(input);
        let output = transform
            .process(&batch, &info_from_wit(info))
            .map_err(error_to_wit)?;
        Ok(output_to_wit(output))
    }
}

/// The `sink` world.
#[cfg(feature = "sink")]
pub mod sink {
    /// Generated by wit-bindgen; the export macro is invoked by `export_sink!`.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unused_qualifications,
        reason = "generated"
    )]
    #[cfg(not(feature = "merge-sink"))]
    pub mod bindings {
        wit_bindgen::generate!({
            world: "sink",
            path: "../wit",
            pub_export_macro: true,
            default_bindings_module: "weir_plugin_sdk::__private::sink::bindings",
            export_macro_name: "export_world",
        });
    }

    /// With `merge-sink`: the same export, plus the `delta-merge` import.
    #[cfg(feature = "merge-sink")]
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unused_qualifications,
        reason = "generated"
    )]
    pub mod bindings {
        wit_bindgen::generate!({
            world: "merge-sink",
            path: "../wit",
            pub_export_macro: true,
            default_bindings_module: "weir_plugin_sdk::__private::sink::bindings",
            export_macro_name: "export_world",
        });
    }

    use crate::Sink;
    use crate::batch::Batch;
    use bindings::weir::plugin::types as wit;

    pub use bindings::exports::weir::plugin::writer::Guest;

    conversions!();

    /// What `open` returns.
    pub type OpenResult = Result<(), wit::PluginError>;
    /// What `write-batch` returns.
    pub type WriteResult = Result<(), wit::PluginError>;

    /// `open`: parse the config and create the instance.
    pub fn open<T: Sink>(
        instance: &mut Option<T>,
        config: String,
        input_schema: Vec<wit::Field>,
    ) -> OpenResult {
        let input = schema_from_wit(input_schema);
        let config = crate::error::parse_config::<T::Config>(&config).map_err(error_to_wit)?;
        *instance = Some(T::new(config, &input).map_err(error_to_wit)?);
        Ok(())
    }

    /// `write-batch`: run the instance on the borrowed batch.
    pub fn write_batch<T: Sink>(
        instance: &mut Option<T>,
        info: wit::BatchInfo,
        input: &wit::Batch,
    ) -> WriteResult {
        let sink = instance.as_mut().ok_or_else(not_open)?;
        sink.write_batch(&Batch::from_host(input), &info_from_wit(info))
            .map_err(error_to_wit)
    }
}

/// The `scalar-function` world.
#[cfg(feature = "scalar-function")]
pub mod scalar {
    /// Generated by wit-bindgen; the export macro is invoked by `export_scalar_function!`.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unused_qualifications,
        reason = "generated"
    )]
    pub mod bindings {
        wit_bindgen::generate!({
            world: "scalar-function",
            path: "../wit",
            pub_export_macro: true,
            default_bindings_module: "weir_plugin_sdk::__private::scalar::bindings",
            export_macro_name: "export_world",
        });
    }

    use crate::ScalarFunctions;
    use crate::batch::Batch;
    use crate::function::Signature;
    use bindings::exports::weir::plugin::scalar as wit_scalar;
    use bindings::weir::plugin::types as wit;

    pub use wit_scalar::Guest;

    conversions!();

    /// The declared functions as the generated trait takes them.
    pub type WitSignatures = Vec<wit_scalar::Signature>;
    /// What `open` returns.
    pub type OpenResult = Result<(), wit::PluginError>;
    /// What `call` returns.
    pub type CallResult = Result<wit::Column, wit::PluginError>;

    /// `open`: parse the config and create the instance for the declared functions.
    pub fn open<T: ScalarFunctions>(
        instance: &mut Option<T>,
        config: String,
        functions: Vec<wit_scalar::Signature>,
    ) -> OpenResult {
        let functions: Vec<Signature> = functions
            .into_iter()
            .map(|f| Signature {
                name: f.name,
                arguments: f.arguments.into_iter().map(data_type_from_wit).collect(),
                returns: data_type_from_wit(f.returns),
            })
            .collect();
        let config = crate::error::parse_config::<T::Config>(&config).map_err(error_to_wit)?;
        *instance = Some(T::new(config, &functions).map_err(error_to_wit)?);
        Ok(())
    }

    /// `call`: run function `name` of the instance on the borrowed batch of arguments.
    pub fn call<T: ScalarFunctions>(
        instance: &mut Option<T>,
        name: String,
        info: wit::BatchInfo,
        args: &wit::Batch,
    ) -> CallResult {
        let functions = instance.as_mut().ok_or_else(not_open)?;
        let column = functions
            .call(&name, &Batch::from_host(args), &info_from_wit(info))
            .map_err(error_to_wit)?;
        Ok(column_to_wit(column))
    }
}

/// `delta-merge` (feature `merge-sink`): the host MERGEs a batch into a granted Delta table.
#[cfg(feature = "merge-sink")]
pub mod merge {
    use super::sink::bindings::weir::plugin::delta_merge as wit_merge;
    use super::sink::bindings::weir::plugin::types as wit;
    use crate::batch::Batch;
    use crate::delta_merge::MergeResult;
    use crate::error::{ErrorKind, PluginError};
    use crate::output::Output;

    /// Calls the host's `merge` with the batch the host lent this call.
    pub fn merge(
        table: &str,
        batch: &Batch<'_>,
        rows: Option<Output>,
    ) -> Result<MergeResult, PluginError> {
        let host = batch
            .host()
            .and_then(|h| h.as_any().downcast_ref::<wit::Batch>())
            .ok_or_else(|| {
                PluginError::fatal("delta-merge: only a batch the host handed in can be merged")
            })?;
        let rows = rows.map(super::sink::output_to_wit);
        match wit_merge::merge(table, host, rows.as_ref()) {
            Ok(r) => Ok(MergeResult {
                skipped: r.skipped,
                updated: r.updated,
                inserted: r.inserted,
            }),
            Err(e) => Err(PluginError {
                kind: match e.kind {
                    wit::ErrorKind::Fatal => ErrorKind::Fatal,
                    wit::ErrorKind::Retryable => ErrorKind::Retryable,
                    wit::ErrorKind::InvalidConfig => ErrorKind::InvalidConfig,
                    wit::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
                },
                message: e.message,
                row: e.row,
            }),
        }
    }
}

/// The `listener` world.
#[cfg(feature = "listener")]
pub mod listener {
    /// Generated by wit-bindgen; the export macro is invoked by `export_listener!`.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unused_qualifications,
        dead_code,
        reason = "generated"
    )]
    pub mod bindings {
        wit_bindgen::generate!({
            world: "listener",
            path: "../wit",
            pub_export_macro: true,
            default_bindings_module: "weir_plugin_sdk::__private::listener::bindings",
            export_macro_name: "export_world",
        });
    }

    use crate::error::{ErrorKind, PluginError};
    use crate::listener::{Listener, Progress};
    use bindings::weir::plugin::types as wit;

    pub use bindings::exports::weir::plugin::query_events::Guest;

    /// What every event returns.
    pub type EventResult = Result<(), wit::PluginError>;

    fn error_to_wit(e: PluginError) -> wit::PluginError {
        wit::PluginError {
            kind: match e.kind {
                ErrorKind::Fatal => wit::ErrorKind::Fatal,
                ErrorKind::Retryable => wit::ErrorKind::Retryable,
                ErrorKind::InvalidConfig => wit::ErrorKind::InvalidConfig,
                ErrorKind::InvalidInput => wit::ErrorKind::InvalidInput,
            },
            message: e.message,
            row: e.row,
        }
    }

    fn with<T: Listener>(
        instance: &mut Option<T>,
        event: impl FnOnce(&mut T) -> Result<(), PluginError>,
    ) -> EventResult {
        let listener = instance.as_mut().ok_or_else(|| {
            error_to_wit(PluginError::fatal(
                "the host called the listener before `open` succeeded",
            ))
        })?;
        event(listener).map_err(error_to_wit)
    }

    /// `open`: parse the config and create the instance.
    pub fn open<T: Listener>(instance: &mut Option<T>, config: String) -> EventResult {
        let config = crate::error::parse_config::<T::Config>(&config).map_err(error_to_wit)?;
        *instance = Some(T::new(config).map_err(error_to_wit)?);
        Ok(())
    }

    pub fn started<T: Listener>(
        instance: &mut Option<T>,
        id: &str,
        run_id: &str,
        name: &str,
    ) -> EventResult {
        with(instance, |l| l.on_started(id, run_id, name))
    }

    pub fn progress<T: Listener>(instance: &mut Option<T>, json: &str) -> EventResult {
        let progress = Progress::parse(json).map_err(error_to_wit)?;
        with(instance, |l| l.on_progress(&progress))
    }

    pub fn idle<T: Listener>(
        instance: &mut Option<T>,
        id: &str,
        run_id: &str,
        timestamp: &str,
    ) -> EventResult {
        with(instance, |l| l.on_idle(id, run_id, timestamp))
    }

    pub fn terminated<T: Listener>(
        instance: &mut Option<T>,
        id: &str,
        run_id: &str,
        error: Option<&str>,
    ) -> EventResult {
        with(instance, |l| l.on_terminated(id, run_id, error))
    }
}
