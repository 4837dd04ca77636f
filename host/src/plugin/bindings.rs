//! Host-side bindings of `wit/weir.wit`, generated at compile time so that a
//! WIT change that the host does not follow is a compile error here.

/// The `transform` world; also owns the shared `types` and `host` interfaces.
pub(crate) mod transform {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "transform",
        with: {
            "weir:plugin/types.batch": crate::plugin::state::HostBatch,
        },
        imports: { default: trappable },
    });
}

/// The `sink` world, reusing the interfaces generated for `transform`.
pub(crate) mod sink {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "sink",
        with: {
            "weir:plugin/types": super::transform::weir::plugin::types,
            "weir:plugin/host": super::transform::weir::plugin::host,
        },
        imports: { default: trappable },
    });
}

/// The `stateful-transform` world: only its `keyed-state` import is used, since
/// its export is the `transform` world's `transformer`, whose bindings drive
/// both kinds of transform.
pub(crate) mod stateful_transform {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "stateful-transform",
        with: {
            "weir:plugin/types": super::transform::weir::plugin::types,
            "weir:plugin/host": super::transform::weir::plugin::host,
        },
        imports: { default: trappable },
    });
}

pub(crate) use transform::weir::plugin::types as wit;

/// The `merge-sink` world: a sink that also imports `delta-merge`.
pub(crate) mod merge_sink {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "merge-sink",
        with: {
            "weir:plugin/types": super::transform::weir::plugin::types,
            "weir:plugin/host": super::transform::weir::plugin::host,
        },
        imports: { default: trappable },
    });
}

/// The `scalar-function` world: vectorised functions that SQL calls by name.
pub(crate) mod scalar_function {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "scalar-function",
        with: {
            "weir:plugin/types": super::transform::weir::plugin::types,
            "weir:plugin/host": super::transform::weir::plugin::host,
        },
        imports: { default: trappable },
    });
}

/// The `listener` world: a query's events (Spark's `StreamingQueryListener`).
pub(crate) mod listener {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "listener",
        with: {
            "weir:plugin/types": super::transform::weir::plugin::types,
            "weir:plugin/host": super::transform::weir::plugin::host,
        },
        imports: { default: trappable },
    });
}
