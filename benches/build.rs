//! Builds the Python, JavaScript and C example plugins for `weir-bench boundary`
//! (the same scripts and content-hash cache as the tests, so this is a copy
//! when the tests have built them), and the misbehaving plugin of the tests for
//! `weir-bench serve noisy` (the same build as the tests').

#[path = "../tests/build_c.rs"]
mod build_c;
#[path = "../host/build_link.rs"]
mod build_link;
#[path = "../tests/build_polyglot.rs"]
mod build_polyglot;
#[path = "../host/build_support.rs"]
mod build_support;

fn main() {
    build_link::link_executables(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/hot-functions.txt"),
    );
    build_support::build_plugins(&[(
        "weir-plugin-hostile",
        "weir_plugin_hostile",
        "WEIR_PLUGIN_HOSTILE",
    )]);
    build_polyglot::build_polyglot_plugins();
    build_c::build_c_plugins();
}
