//! What the command prints for people: text from the store made safe for a terminal, and tables
//! aligned by how wide their cells look, not by how many bytes they hold.
//!
//! Tenants, tool names, notes and reasons come from callers and operators: a control character
//! (an escape sequence, a carriage return) or a bidirectional override in them must not reach the
//! terminal as such, so each is shown escaped (`\u{1b}`). Wide characters (CJK, emoji) count two
//! columns, combining marks none.

use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_width::UnicodeWidthStr;

/// `text` with every control character and bidirectional formatting character escaped.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// How a column is aligned.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A table: a header, then rows of cells; every cell is made [`printable`].
pub(crate) struct Table {
    columns: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub(crate) fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            columns: columns.iter().map(|(t, a)| ((*t).to_owned(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub(crate) fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let row: Vec<String> = cells
            .into_iter()
            .map(|c| printable(c.as_ref()).into_owned())
            .collect();
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    /// The table as lines, columns two spaces apart; the last column is not padded.
    pub(crate) fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].width())
                    .chain([self.columns[i].0.width()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        let titles: Vec<&str> = self.columns.iter().map(|(t, _)| t.as_str()).collect();
        for row in std::iter::once(titles).chain(
            self.rows
                .iter()
                .map(|r| r.iter().map(String::as_str).collect()),
        ) {
            let last = row.len() - 1;
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.width());
                let (left, right) = match self.columns[i].1 {
                    Align::Left if i == last => (0, 0),
                    Align::Left => (0, pad),
                    Align::Right => (pad, 0),
                };
                if i > 0 {
                    line.push_str("  ");
                }
                line.extend(std::iter::repeat_n(' ', left));
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', right));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use unicode_width::UnicodeWidthStr;

    use super::{Align, Table, printable};

    #[test]
    fn control_and_bidi_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(printable("tenant-a"), "tenant-a");
        assert_eq!(printable("日本語 ✓"), "日本語 ✓");
        assert_eq!(printable("a\u{1b}[31mred"), "a\\u{1b}[31mred");
        assert_eq!(printable("x\r\ny\t"), "x\\u{d}\\u{a}y\\u{9}");
        assert_eq!(printable("abc\u{202e}fed"), "abc\\u{202e}fed");
    }

    #[test]
    fn columns_line_up_by_display_width() {
        let mut t = Table::new(&[
            ("tenant", Align::Left),
            ("n", Align::Right),
            ("note", Align::Left),
        ]);
        t.row(["日本", "7", "ok"]);
        t.row(["ascii-tenant", "12", "é\u{301}t\u{e9}"]);
        t.row(["bad\u{1b}", "3", "x"]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        // The second column ends at the same display column on every line.
        let ends: Vec<usize> = lines
            .iter()
            .map(|l| {
                let cut = l.rfind("  ").unwrap();
                l[..cut].width()
            })
            .collect();
        assert!(ends.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert!(text.contains("bad\\u{1b}"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }
}
