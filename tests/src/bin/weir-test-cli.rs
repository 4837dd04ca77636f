//! The `weir` command line, built inside the test package so that tests can
//! run it as a child process (see the package manifest).

fn main() -> std::process::ExitCode {
    weir_host::cli::main()
}
