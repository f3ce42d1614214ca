//! ANSI colours when stdout is a terminal, plain text otherwise.

use std::borrow::Cow;
use std::io::IsTerminal;

/// A colour (or weight) of terminal text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Colour {
    Red,
    Green,
    Yellow,
    Blue,
    Cyan,
    Dim,
    Bold,
}

impl Colour {
    fn code(self) -> &'static str {
        match self {
            Colour::Red => "31",
            Colour::Green => "32",
            Colour::Yellow => "33",
            Colour::Blue => "34",
            Colour::Cyan => "36",
            Colour::Dim => "2",
            Colour::Bold => "1",
        }
    }
}

/// Whether output is painted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Style {
    colour: bool,
}

impl Style {
    /// Colours when stdout is a terminal and `NO_COLOR` is not set.
    pub(crate) fn detect() -> Self {
        Style {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    /// Colours or not, as told (a child process whose stdout is a pipe to a
    /// parent printing on a terminal).
    pub(crate) fn with_colour(colour: bool) -> Self {
        Style { colour }
    }

    /// Whether output is painted.
    pub(crate) fn is_coloured(&self) -> bool {
        self.colour
    }

    /// `text` in `colour`, or as is.
    pub(crate) fn paint<'a>(&self, colour: Colour, text: &'a str) -> Cow<'a, str> {
        if self.colour {
            Cow::Owned(format!("\x1b[{}m{text}\x1b[0m", colour.code()))
        } else {
            Cow::Borrowed(text)
        }
    }
}
