//! Aligned plain-text tables, coloured only when asked (stdout is a terminal).

/// How a cell reads: the colour it gets on a terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tone {
    /// No colour.
    Plain,
    /// Green: works, ok.
    Good,
    /// Yellow: works with a caveat, or not checked.
    Warn,
    /// Red: broken.
    Bad,
}

impl Tone {
    fn ansi(self) -> Option<&'static str> {
        match self {
            Tone::Plain => None,
            Tone::Good => Some("\x1b[32m"),
            Tone::Warn => Some("\x1b[33m"),
            Tone::Bad => Some("\x1b[31m"),
        }
    }
}

/// One cell: its text and tone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cell {
    text: String,
    tone: Tone,
}

impl Cell {
    /// A cell with a tone.
    pub(crate) fn toned(text: impl Into<String>, tone: Tone) -> Cell {
        Cell {
            text: text.into(),
            tone,
        }
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::toned(text, Tone::Plain)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::toned(text, Tone::Plain)
    }
}

/// A table: a header row and rows, columns padded to the widest cell.
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    /// A table with these column headers.
    pub(crate) fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells render empty.
    pub(crate) fn row(&mut self, cells: Vec<Cell>) -> &mut Table {
        self.rows.push(cells);
        self
    }

    /// True when no row was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as lines, indented by `indent` spaces, coloured when `colour`.
    /// Widths count characters, and padding goes outside the colour codes, so
    /// coloured and plain output align the same.
    pub(crate) fn render(&self, indent: usize, colour: bool) -> String {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.headers.len()])
            .max()
            .unwrap_or(0);
        let mut width = vec![0; cols];
        let header_cells: Vec<Cell> = self
            .headers
            .iter()
            .map(|h| Cell::from(h.as_str()))
            .collect();
        for row in std::iter::once(&header_cells).chain(&self.rows) {
            for (i, c) in row.iter().enumerate() {
                width[i] = width[i].max(c.text.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&header_cells).chain(&self.rows) {
            let mut line = " ".repeat(indent);
            for (i, w) in width.iter().enumerate() {
                let cell = row.get(i);
                let text = cell.map(|c| c.text.as_str()).unwrap_or("");
                let tone = cell.map(|c| c.tone).unwrap_or(Tone::Plain);
                line.push_str(&paint(text, tone, colour));
                if i + 1 < cols {
                    line.push_str(&" ".repeat(w - text.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` in `tone`'s colour when `colour`, else as is.
pub(crate) fn paint(text: &str, tone: Tone, colour: bool) -> String {
    match (colour, tone.ansi()) {
        (true, Some(code)) => format!("{code}{text}\x1b[0m"),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(&["FRONTEND", "STATE", "LISTENER"]);
        t.row(vec![
            "203.0.113.10:80".into(),
            Cell::toned("active", Tone::Good),
            "192.0.2.1:40001".into(),
        ]);
        t.row(vec![
            "[2001:db8:ffff::10]:443".into(),
            Cell::toned("failed", Tone::Bad),
        ]);
        t
    }

    #[test]
    fn columns_align_to_the_widest_cell_and_lines_have_no_trailing_space() {
        assert_eq!(
            sample().render(2, false),
            "  FRONTEND                 STATE   LISTENER\n\
             \x20 203.0.113.10:80          active  192.0.2.1:40001\n\
             \x20 [2001:db8:ffff::10]:443  failed\n"
        );
    }

    #[test]
    fn colour_wraps_the_text_but_not_the_padding() {
        let coloured = sample().render(0, true);
        let line = coloured.lines().nth(1).expect("row");
        assert_eq!(
            line,
            "203.0.113.10:80          \x1b[32mactive\x1b[0m  192.0.2.1:40001"
        );
        let plain: String = coloured
            .replace("\x1b[32m", "")
            .replace("\x1b[31m", "")
            .replace("\x1b[0m", "");
        assert_eq!(plain, sample().render(0, false));
    }

    #[test]
    fn an_empty_table_is_just_its_header() {
        let t = Table::new(&["A", "B"]);
        assert!(t.is_empty());
        assert_eq!(t.render(0, false), "A  B\n");
        assert_eq!(paint("x", Tone::Warn, false), "x");
        assert_eq!(paint("x", Tone::Warn, true), "\x1b[33mx\x1b[0m");
    }
}
