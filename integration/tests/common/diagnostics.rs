//! The check both trybuild suites make of their expected `.stderr` files (this package's edition
//! 2024 cases and `ui-2021`'s): include it with `#[path]`.

/// Every `.stderr` under `dir` holds one error (but those named in `several`) and names none of
/// idem's private machinery.
pub fn one_error_each(dir: &str, several: &[&str]) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "stderr") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let errors = text.lines().filter(|l| l.starts_with("error")).count();
        let name = path.file_name().unwrap().to_string_lossy();
        if !several.contains(&name.as_ref()) {
            assert_eq!(errors, 1, "{}: one misuse, one error", path.display());
        }
        for private in ["__private", "KeyPartProbe"] {
            assert!(
                !text.contains(private),
                "{} names `{private}`",
                path.display()
            );
        }
    }
}
