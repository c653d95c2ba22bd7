//! The `idem` command: look into an idem store and repair it (see the README's "Operating"
//! section, or `idem --help`).

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
