//! Builds the Python and JavaScript example plugins for `weir-bench boundary`
//! (the same scripts and content-hash cache as the tests, so this is a copy
//! when the tests have built them).

#[path = "../tests/build_polyglot.rs"]
mod build_polyglot;

fn main() {
    build_polyglot::build_polyglot_plugins();
}
