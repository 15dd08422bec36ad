//! The lexer: template text into items, as Go's `text/template/parse` scans it
//! (delimiters `{{ }}`, trim markers `{{- ` and ` -}}`, comments `{{/* */}}`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ItemKind {
    Error,
    Bool,
    Char,
    CharConstant,
    Complex,
    Assign,
    Declare,
    Eof,
    Field,
    Identifier,
    LeftDelim,
    LeftParen,
    Number,
    Pipe,
    RawString,
    RightDelim,
    RightParen,
    Space,
    String,
    Text,
    Variable,
    // Keywords.
    Block,
    Break,
    Continue,
    Dot,
    Define,
    Else,
    End,
    If,
    Nil,
    Range,
    Template,
    With,
}

impl ItemKind {
    fn is_keyword(self) -> bool {
        matches!(
            self,
            ItemKind::Block
                | ItemKind::Break
                | ItemKind::Continue
                | ItemKind::Dot
                | ItemKind::Define
                | ItemKind::Else
                | ItemKind::End
                | ItemKind::If
                | ItemKind::Nil
                | ItemKind::Range
                | ItemKind::Template
                | ItemKind::With
        )
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Item {
    pub kind: ItemKind,
    /// Byte offset of the item in the template text.
    pub pos: usize,
    /// The item's text (for errors: the message).
    pub val: String,
    /// 1-based line the item starts on.
    pub line: usize,
}

impl Item {
    /// How Go's parser names an item in "unexpected X in Y".
    pub fn describe(&self) -> String {
        match self.kind {
            ItemKind::Eof => "EOF".to_string(),
            ItemKind::Error => self.val.clone(),
            k if k.is_keyword() => format!("<{}>", self.val),
            _ => {
                if self.val.chars().count() > 10 {
                    let head: String = self.val.chars().take(10).collect();
                    format!("{}...", super::fmt::quote_go(&head))
                } else {
                    super::fmt::quote_go(&self.val)
                }
            }
        }
    }
}

const LEFT: &str = "{{";
const RIGHT: &str = "}}";
const LEFT_COMMENT: &str = "/*";
const RIGHT_COMMENT: &str = "*/";

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_alnum(c: char) -> bool {
    c == '_' || c.is_alphabetic() || c.is_numeric()
}

/// Whether `s` starts with a left trim marker: `-` then a space.
fn has_left_trim(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next() == Some('-') && chars.next().is_some_and(is_space)
}

/// Whether `s` starts with a right trim marker: a space then `-`.
fn has_right_trim(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(is_space) && chars.next() == Some('-')
}

/// Scans the whole input into items. Scanning stops at the first error item.
pub(crate) fn lex(input: &str) -> Vec<Item> {
    let mut lexer = Lexer {
        input,
        pos: 0,
        start: 0,
        line: 1,
        start_line: 1,
        paren_depth: 0,
        items: Vec::new(),
    };
    lexer.run();
    lexer.items
}

struct Lexer<'a> {
    input: &'a str,
    pos: usize,
    start: usize,
    line: usize,
    start_line: usize,
    paren_depth: usize,
    items: Vec<Item>,
}

enum State {
    Text,
    LeftDelim,
    InsideAction,
    Done,
}

impl<'a> Lexer<'a> {
    fn rest(&self) -> &'a str {
        &self.input[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn backup(&mut self, c: Option<char>) {
        if let Some(c) = c {
            self.pos -= c.len_utf8();
            if c == '\n' {
                self.line -= 1;
            }
        }
    }

    fn emit(&mut self, kind: ItemKind) {
        self.items.push(Item {
            kind,
            pos: self.start,
            val: self.input[self.start..self.pos].to_string(),
            line: self.start_line,
        });
        self.start = self.pos;
        self.start_line = self.line;
    }

    /// Drops the pending input; the line count already covers it.
    fn ignore(&mut self) {
        self.start = self.pos;
        self.start_line = self.line;
    }

    /// Advances over bytes known to hold no newline accounting of their own.
    fn skip(&mut self, n: usize) {
        self.line += self.input[self.pos..self.pos + n].matches('\n').count();
        self.pos += n;
    }

    fn error(&mut self, message: String) -> State {
        self.items.push(Item {
            kind: ItemKind::Error,
            pos: self.start,
            val: message,
            line: self.start_line,
        });
        State::Done
    }

    fn run(&mut self) {
        let mut state = State::Text;
        loop {
            state = match state {
                State::Text => self.lex_text(),
                State::LeftDelim => self.lex_left_delim(),
                State::InsideAction => self.lex_inside_action(),
                State::Done => return,
            };
        }
    }

    fn lex_text(&mut self) -> State {
        if let Some(x) = self.rest().find(LEFT) {
            if x > 0 {
                let text_end = self.pos + x;
                let after = &self.input[text_end + LEFT.len()..];
                let mut trimmed_end = text_end;
                if has_left_trim(after) {
                    trimmed_end = self.start
                        + self.input[self.start..text_end]
                            .trim_end_matches(is_space)
                            .len();
                }
                self.pos = trimmed_end;
                self.line += self.input[self.start..trimmed_end].matches('\n').count();
                if self.pos > self.start {
                    self.emit(ItemKind::Text);
                }
                self.skip(text_end - trimmed_end);
                self.ignore();
            }
            return State::LeftDelim;
        }
        self.pos = self.input.len();
        if self.pos > self.start {
            self.line += self.input[self.start..].matches('\n').count();
            self.emit(ItemKind::Text);
        }
        self.emit(ItemKind::Eof);
        State::Done
    }

    /// Whether the input is at a right delimiter, and whether that one trims.
    fn at_right_delim(&self) -> (bool, bool) {
        let rest = self.rest();
        if has_right_trim(rest) && rest[2..].starts_with(RIGHT) {
            return (true, true);
        }
        (rest.starts_with(RIGHT), false)
    }

    fn lex_left_delim(&mut self) -> State {
        self.pos += LEFT.len();
        let trim = has_left_trim(self.rest());
        let after_marker = if trim { 2 } else { 0 };
        if self.rest()[after_marker..].starts_with(LEFT_COMMENT) {
            self.skip(after_marker);
            self.ignore();
            return self.lex_comment();
        }
        self.emit(ItemKind::LeftDelim);
        self.skip(after_marker);
        self.ignore();
        self.paren_depth = 0;
        State::InsideAction
    }

    fn lex_comment(&mut self) -> State {
        self.pos += LEFT_COMMENT.len();
        let Some(x) = self.rest().find(RIGHT_COMMENT) else {
            return self.error("unclosed comment".to_string());
        };
        self.skip(x + RIGHT_COMMENT.len());
        let (delim, trim) = self.at_right_delim();
        if !delim {
            return self.error("comment ends before closing delimiter".to_string());
        }
        if trim {
            self.skip(2);
        }
        self.pos += RIGHT.len();
        if trim {
            let n = self.rest().len() - self.rest().trim_start_matches(is_space).len();
            self.skip(n);
        }
        self.ignore();
        State::Text
    }

    fn lex_right_delim(&mut self) -> State {
        let (_, trim) = self.at_right_delim();
        if trim {
            self.skip(2);
            self.ignore();
        }
        self.pos += RIGHT.len();
        self.emit(ItemKind::RightDelim);
        if trim {
            let n = self.rest().len() - self.rest().trim_start_matches(is_space).len();
            self.skip(n);
            self.ignore();
        }
        State::Text
    }

    fn lex_inside_action(&mut self) -> State {
        let (delim, _) = self.at_right_delim();
        if delim {
            if self.paren_depth == 0 {
                return self.lex_right_delim();
            }
            return self.error("unclosed left paren".to_string());
        }
        let Some(c) = self.next() else {
            return self.error("unclosed action".to_string());
        };
        match c {
            c if is_space(c) => {
                self.backup(Some(c));
                return self.lex_space();
            }
            '=' => self.emit(ItemKind::Assign),
            ':' => {
                if self.next() != Some('=') {
                    return self.error("expected :=".to_string());
                }
                self.emit(ItemKind::Declare);
            }
            '|' => self.emit(ItemKind::Pipe),
            '"' => return self.lex_quote(),
            '`' => return self.lex_raw_quote(),
            '$' => return self.lex_variable(),
            '\'' => return self.lex_char(),
            '.' => {
                let next_is_digit = self.peek().is_some_and(|d| d.is_ascii_digit());
                if !next_is_digit {
                    return self.lex_field_or_variable(ItemKind::Field);
                }
                self.backup(Some(c));
                return self.lex_number();
            }
            '+' | '-' | '0'..='9' => {
                self.backup(Some(c));
                return self.lex_number();
            }
            c if is_alnum(c) => {
                self.backup(Some(c));
                return self.lex_identifier();
            }
            '(' => {
                self.emit(ItemKind::LeftParen);
                self.paren_depth += 1;
            }
            ')' => {
                if self.paren_depth == 0 {
                    return self.error("unexpected right paren".to_string());
                }
                self.paren_depth -= 1;
                self.emit(ItemKind::RightParen);
            }
            c if c.is_ascii() && !c.is_ascii_control() => self.emit(ItemKind::Char),
            c => {
                return self.error(format!(
                    "unrecognized character in action: {}",
                    super::fmt::unicode_name(c)
                ));
            }
        }
        State::InsideAction
    }

    fn lex_space(&mut self) -> State {
        let mut count = 0;
        while self.peek().is_some_and(is_space) {
            self.next();
            count += 1;
        }
        // A space followed by "-}}" belongs to the trimming right delimiter.
        let before = &self.input[self.pos - 1..];
        if has_right_trim(before) && before[2..].starts_with(RIGHT) {
            self.backup(Some(before.chars().next().unwrap_or(' ')));
            if count == 1 {
                return self.lex_right_delim();
            }
        }
        self.emit(ItemKind::Space);
        State::InsideAction
    }

    fn at_terminator(&self) -> bool {
        match self.peek() {
            None => true,
            Some(c) if is_space(c) => true,
            Some('.' | ',' | '|' | ':' | ')' | '(' | '}') => true,
            _ => false,
        }
    }

    fn lex_identifier(&mut self) -> State {
        while self.peek().is_some_and(is_alnum) {
            self.next();
        }
        if !self.at_terminator() {
            let c = self.peek().unwrap_or(' ');
            return self.error(format!("bad character {}", super::fmt::unicode_name(c)));
        }
        let word = &self.input[self.start..self.pos];
        let kind = match word {
            "block" => ItemKind::Block,
            "break" => ItemKind::Break,
            "continue" => ItemKind::Continue,
            "define" => ItemKind::Define,
            "else" => ItemKind::Else,
            "end" => ItemKind::End,
            "if" => ItemKind::If,
            "range" => ItemKind::Range,
            "nil" => ItemKind::Nil,
            "template" => ItemKind::Template,
            "with" => ItemKind::With,
            "true" | "false" => ItemKind::Bool,
            _ => ItemKind::Identifier,
        };
        self.emit(kind);
        State::InsideAction
    }

    fn lex_variable(&mut self) -> State {
        if self.at_terminator() {
            self.emit(ItemKind::Variable);
            return State::InsideAction;
        }
        self.lex_field_or_variable(ItemKind::Variable)
    }

    fn lex_field_or_variable(&mut self, kind: ItemKind) -> State {
        if self.at_terminator() {
            self.emit(if kind == ItemKind::Variable {
                ItemKind::Variable
            } else {
                ItemKind::Dot
            });
            return State::InsideAction;
        }
        while self.peek().is_some_and(is_alnum) {
            self.next();
        }
        if !self.at_terminator() {
            let c = self.peek().unwrap_or(' ');
            return self.error(format!("bad character {}", super::fmt::unicode_name(c)));
        }
        self.emit(kind);
        State::InsideAction
    }

    fn lex_char(&mut self) -> State {
        loop {
            match self.next() {
                Some('\\') => match self.next() {
                    None | Some('\n') => {
                        return self.error("unterminated character constant".to_string());
                    }
                    Some(_) => {}
                },
                None | Some('\n') => {
                    return self.error("unterminated character constant".to_string());
                }
                Some('\'') => break,
                Some(_) => {}
            }
        }
        self.emit(ItemKind::CharConstant);
        State::InsideAction
    }

    fn lex_number(&mut self) -> State {
        if !self.scan_number() {
            let text = self.input[self.start..self.pos].to_string();
            return self.error(format!(
                "bad number syntax: {}",
                super::fmt::quote_go(&text)
            ));
        }
        if matches!(self.peek(), Some('+' | '-')) {
            if !self.scan_number() || !self.input[..self.pos].ends_with('i') {
                let text = self.input[self.start..self.pos].to_string();
                return self.error(format!(
                    "bad number syntax: {}",
                    super::fmt::quote_go(&text)
                ));
            }
            self.emit(ItemKind::Complex);
        } else {
            self.emit(ItemKind::Number);
        }
        State::InsideAction
    }

    fn accept(&mut self, valid: &str) -> bool {
        match self.peek() {
            Some(c) if valid.contains(c) => {
                self.next();
                true
            }
            _ => false,
        }
    }

    fn accept_run(&mut self, valid: &str) {
        while self.accept(valid) {}
    }

    fn scan_number(&mut self) -> bool {
        self.accept("+-");
        let mut digits = "0123456789_";
        if self.accept("0") {
            if self.accept("xX") {
                digits = "0123456789abcdefABCDEF_";
            } else if self.accept("oO") {
                digits = "01234567_";
            } else if self.accept("bB") {
                digits = "01_";
            }
        }
        self.accept_run(digits);
        if self.accept(".") {
            self.accept_run(digits);
        }
        if digits.len() == 11 && self.accept("eE") {
            self.accept("+-");
            self.accept_run("0123456789_");
        }
        if digits.len() == 23 && self.accept("pP") {
            self.accept("+-");
            self.accept_run("0123456789_");
        }
        self.accept("i");
        if self.peek().is_some_and(is_alnum) {
            self.next();
            return false;
        }
        true
    }

    fn lex_quote(&mut self) -> State {
        loop {
            match self.next() {
                Some('\\') => match self.next() {
                    None | Some('\n') => {
                        return self.error("unterminated quoted string".to_string());
                    }
                    Some(_) => {}
                },
                None | Some('\n') => return self.error("unterminated quoted string".to_string()),
                Some('"') => break,
                Some(_) => {}
            }
        }
        self.emit(ItemKind::String);
        State::InsideAction
    }

    fn lex_raw_quote(&mut self) -> State {
        loop {
            match self.next() {
                None => return self.error("unterminated raw quoted string".to_string()),
                Some('`') => break,
                Some(_) => {}
            }
        }
        self.emit(ItemKind::RawString);
        State::InsideAction
    }
}
