//! The `weir` binary; see [`weir_host::cli`].

fn main() -> std::process::ExitCode {
    weir_host::cli::main()
}
