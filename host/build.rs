//! Compiles the example plugins to `wasm32-wasip2` components as part of the
//! host's build, so that `weir demo`, the tests and the benchmarks always run
//! the plugins built from this very source tree, with no manual step.

#[path = "build_support.rs"]
mod build_support;

#[path = "build_link.rs"]
mod build_link;

fn main() {
    build_link::link_executables(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hot-functions.txt"),
    );
    build_support::build_plugins(&[
        (
            "weir-plugin-filter-rows",
            "weir_plugin_filter_rows",
            "WEIR_PLUGIN_FILTER_ROWS",
        ),
        (
            "weir-plugin-normalize-status",
            "weir_plugin_normalize_status",
            "WEIR_PLUGIN_NORMALIZE_STATUS",
        ),
        (
            "weir-plugin-jsonl-sink",
            "weir_plugin_jsonl_sink",
            "WEIR_PLUGIN_JSONL_SINK",
        ),
        (
            "weir-plugin-running-total",
            "weir_plugin_running_total",
            "WEIR_PLUGIN_RUNNING_TOTAL",
        ),
        (
            "weir-plugin-merge-sink",
            "weir_plugin_merge_sink",
            "WEIR_PLUGIN_MERGE_SINK",
        ),
        (
            "weir-plugin-count-char",
            "weir_plugin_count_char",
            "WEIR_PLUGIN_COUNT_CHAR",
        ),
        (
            "weir-plugin-query-log",
            "weir_plugin_query_log",
            "WEIR_PLUGIN_QUERY_LOG",
        ),
    ]);
}
