//! Compiles the misbehaving plugin of the sandbox tests to a `wasm32-wasip2`
//! component, the same way the host builds its example plugins.

#[path = "../host/build_support.rs"]
mod build_support;

fn main() {
    build_support::build_plugins(&[(
        "weir-plugin-hostile",
        "weir_plugin_hostile",
        "WEIR_PLUGIN_HOSTILE",
    )]);
}
