//! Compiles the misbehaving plugin of the sandbox tests to a `wasm32-wasip2`
//! component, the same way the host builds its example plugins, and the
//! Python and JavaScript example plugins with their own tools.

#[path = "build_polyglot.rs"]
mod build_polyglot;
#[path = "../host/build_support.rs"]
mod build_support;

fn main() {
    build_support::build_plugins(&[(
        "weir-plugin-hostile",
        "weir_plugin_hostile",
        "WEIR_PLUGIN_HOSTILE",
    )]);
    build_polyglot::build_polyglot_plugins();
}
