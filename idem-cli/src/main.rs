//! The `idem` command: look into an idem store and repair it (`idem --help`, or the README of
//! the `idem-cli` package).

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
