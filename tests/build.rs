//! Compiles the misbehaving plugins of the sandbox tests to `wasm32-wasip2`
//! components, the same way the host builds its example plugins, and the
//! Python and JavaScript example plugins with their own tools, and the C ones with clang.

#[path = "build_c.rs"]
mod build_c;
#[path = "build_polyglot.rs"]
mod build_polyglot;
#[path = "../host/build_support.rs"]
mod build_support;

fn main() {
    build_support::build_plugins(&[
        (
            "weir-plugin-hostile",
            "weir_plugin_hostile",
            "WEIR_PLUGIN_HOSTILE",
        ),
        (
            "weir-plugin-hostile-state",
            "weir_plugin_hostile_state",
            "WEIR_PLUGIN_HOSTILE_STATE",
        ),
    ]);
    build_polyglot::build_polyglot_plugins();
    build_c::build_c_plugins();
}
