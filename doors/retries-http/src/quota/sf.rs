//! The part of HTTP Structured Field Values (RFC 9651) the quota fields
//! use: a List whose members are Items with Parameters. Written for hostile
//! input: every byte is checked, nothing is allocated before its bound is
//! known, and a field that does not parse is an error as a whole (RFC 9651
//! §4.2: a recipient that fails to parse a field ignores it).

/// A bare item's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Bare {
    /// An Integer (at most 15 digits, RFC 9651 §3.3.1).
    Integer(i64),
    /// A Decimal, as read (at most 12 integer and 3 fractional digits).
    Decimal(f64),
    /// A String (printable ASCII).
    String(String),
    /// A Token.
    Token(String),
    /// A Byte Sequence, decoded.
    Bytes(Vec<u8>),
    /// A Boolean.
    Boolean(bool),
    /// A Date (`@` and an Integer), or a Display String (`%"…"`), read
    /// and kept only as "something else": the quota fields use neither.
    Other,
}

/// One member of a List: an Item, or an Inner List (kept as `None`: the
/// quota fields have no use for one).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub(crate) item: Option<Bare>,
    pub(crate) params: Vec<(String, Bare)>,
}

impl Member {
    /// The value of parameter `key` (the last one, as RFC 9651 keeps it).
    pub(crate) fn param(&self, key: &str) -> Option<&Bare> {
        self.params
            .iter()
            .rev()
            .find_map(|(k, v)| (k == key).then_some(v))
    }
}

/// Where and why a field failed to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) at: usize,
    pub(crate) why: &'static str,
}

/// The most members and parameters of one field taken: a server announces
/// a handful of policies; a field of thousands is an attack.
const MAX_MEMBERS: usize = 64;
const MAX_PARAMS: usize = 32;

struct Reader<'a> {
    input: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn fail<T>(&self, why: &'static str) -> Result<T, SyntaxError> {
        Err(SyntaxError { at: self.at, why })
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.at += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }
}

/// Parse `input` as a List (RFC 9651 §4.2.1). An empty field is an empty
/// list.
pub(crate) fn parse_list(input: &[u8]) -> Result<Vec<Member>, SyntaxError> {
    let mut r = Reader { input, at: 0 };
    r.skip_sp();
    let mut members = Vec::new();
    if r.peek().is_none() {
        return Ok(members);
    }
    loop {
        if members.len() == MAX_MEMBERS {
            return r.fail("more members than a quota field has");
        }
        members.push(member(&mut r)?);
        r.skip_ows();
        match r.peek() {
            None => return Ok(members),
            Some(b',') => {
                r.at += 1;
                r.skip_ows();
                if r.peek().is_none() {
                    return r.fail("a comma ends the list");
                }
            }
            Some(_) => return r.fail("members are separated by commas"),
        }
    }
}

fn member(r: &mut Reader<'_>) -> Result<Member, SyntaxError> {
    if r.peek() == Some(b'(') {
        inner_list(r)?;
        let params = parameters(r)?;
        return Ok(Member { item: None, params });
    }
    let item = bare(r)?;
    let params = parameters(r)?;
    Ok(Member {
        item: Some(item),
        params,
    })
}

fn inner_list(r: &mut Reader<'_>) -> Result<(), SyntaxError> {
    r.at += 1; // `(`
    let mut n = 0;
    loop {
        r.skip_sp();
        if r.peek() == Some(b')') {
            r.at += 1;
            return Ok(());
        }
        n += 1;
        if n > MAX_MEMBERS {
            return r.fail("an inner list too long");
        }
        bare(r)?;
        parameters(r)?;
        if !matches!(r.peek(), Some(b' ' | b')')) {
            return r.fail("inner list items are separated by spaces");
        }
    }
}

fn parameters(r: &mut Reader<'_>) -> Result<Vec<(String, Bare)>, SyntaxError> {
    let mut params: Vec<(String, Bare)> = Vec::new();
    while r.peek() == Some(b';') {
        r.at += 1;
        r.skip_sp();
        if params.len() == MAX_PARAMS {
            return r.fail("more parameters than a quota field has");
        }
        let k = key(r)?;
        let v = if r.peek() == Some(b'=') {
            r.at += 1;
            bare(r)?
        } else {
            Bare::Boolean(true)
        };
        // A repeated key keeps its last value, in its first place.
        match params.iter_mut().find(|(p, _)| *p == k) {
            Some(slot) => slot.1 = v,
            None => params.push((k, v)),
        }
    }
    Ok(params)
}

fn key(r: &mut Reader<'_>) -> Result<String, SyntaxError> {
    let start = r.at;
    match r.peek() {
        Some(b'a'..=b'z' | b'*') => r.at += 1,
        _ => return r.fail("a key starts with a lowercase letter or `*`"),
    }
    while matches!(
        r.peek(),
        Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')
    ) {
        r.at += 1;
    }
    Ok(ascii(&r.input[start..r.at]))
}

fn ascii(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

fn bare(r: &mut Reader<'_>) -> Result<Bare, SyntaxError> {
    match r.peek() {
        Some(b'-' | b'0'..=b'9') => number(r),
        Some(b'"') => string(r).map(Bare::String),
        Some(b':') => bytes(r),
        Some(b'?') => boolean(r),
        Some(b'@') => {
            r.at += 1;
            match number(r)? {
                Bare::Integer(_) => Ok(Bare::Other),
                _ => r.fail("a date is an integer"),
            }
        }
        Some(b'%') => {
            r.at += 1;
            if r.peek() != Some(b'"') {
                return r.fail("a display string is quoted");
            }
            display_string(r)
        }
        Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => Ok(Bare::Token(token(r))),
        _ => r.fail("not an item"),
    }
}

fn number(r: &mut Reader<'_>) -> Result<Bare, SyntaxError> {
    let negative = r.peek() == Some(b'-');
    if negative {
        r.at += 1;
    }
    let start = r.at;
    let mut dot = None;
    while let Some(c) = r.peek() {
        match c {
            b'0'..=b'9' => {}
            b'.' if dot.is_none() => {
                if r.at - start > 12 {
                    return r.fail("a decimal has at most 12 integer digits");
                }
                dot = Some(r.at);
            }
            _ => break,
        }
        r.at += 1;
        let len = r.at - start;
        if (dot.is_none() && len > 15) || len > 16 {
            return r.fail("a number too long");
        }
    }
    let digits = &r.input[start..r.at];
    if digits.first().is_none_or(|c| !c.is_ascii_digit()) {
        return r.fail("a number starts with a digit");
    }
    // Only ASCII digits and at most one dot were taken.
    let text = ascii(digits);
    match dot {
        None => {
            let v: i64 = text.parse().map_err(|_| SyntaxError {
                at: start,
                why: "an integer",
            })?;
            Ok(Bare::Integer(if negative { -v } else { v }))
        }
        Some(d) => {
            let frac = r.at - d - 1;
            if frac == 0 || frac > 3 {
                return r.fail("a decimal has 1 to 3 fractional digits");
            }
            let v: f64 = text.parse().map_err(|_| SyntaxError {
                at: start,
                why: "a decimal",
            })?;
            Ok(Bare::Decimal(if negative { -v } else { v }))
        }
    }
}

fn string(r: &mut Reader<'_>) -> Result<String, SyntaxError> {
    r.at += 1; // `"`
    let mut out = String::new();
    loop {
        match r.peek() {
            None => return r.fail("a string is not closed"),
            Some(b'"') => {
                r.at += 1;
                return Ok(out);
            }
            Some(b'\\') => {
                r.at += 1;
                match r.peek() {
                    Some(c @ (b'"' | b'\\')) => out.push(char::from(c)),
                    _ => return r.fail("only `\\\"` and `\\\\` are escapes"),
                }
            }
            Some(c @ 0x20..=0x7e) => out.push(char::from(c)),
            Some(_) => return r.fail("a string holds printable ASCII only"),
        }
        r.at += 1;
    }
}

fn display_string(r: &mut Reader<'_>) -> Result<Bare, SyntaxError> {
    r.at += 1; // `"`
    loop {
        match r.peek() {
            None => return r.fail("a display string is not closed"),
            Some(b'"') => {
                r.at += 1;
                return Ok(Bare::Other);
            }
            Some(b'%') => {
                let hex = r.input.get(r.at + 1..r.at + 3);
                if !hex.is_some_and(|h| h.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))) {
                    return r.fail("a display string's escape is two lowercase hex digits");
                }
                r.at += 3;
            }
            Some(0x20..=0x7e) => r.at += 1,
            Some(_) => return r.fail("a display string holds printable ASCII only"),
        }
    }
}

fn token(r: &mut Reader<'_>) -> String {
    let start = r.at;
    r.at += 1;
    while let Some(c) = r.peek() {
        let tchar = c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c);
        if !tchar {
            break;
        }
        r.at += 1;
    }
    ascii(&r.input[start..r.at])
}

fn bytes(r: &mut Reader<'_>) -> Result<Bare, SyntaxError> {
    r.at += 1; // `:`
    let start = r.at;
    while let Some(c) = r.peek() {
        if c == b':' {
            break;
        }
        if !(c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=')) {
            return r.fail("a byte sequence is base64");
        }
        r.at += 1;
    }
    if r.peek() != Some(b':') {
        return r.fail("a byte sequence is not closed");
    }
    let encoded = &r.input[start..r.at];
    r.at += 1;
    match base64(encoded) {
        Some(b) => Ok(Bare::Bytes(b)),
        None => Err(SyntaxError {
            at: start,
            why: "a byte sequence is base64",
        }),
    }
}

fn boolean(r: &mut Reader<'_>) -> Result<Bare, SyntaxError> {
    r.at += 1; // `?`
    let v = match r.peek() {
        Some(b'1') => true,
        Some(b'0') => false,
        _ => return r.fail("a boolean is ?0 or ?1"),
    };
    r.at += 1;
    Ok(Bare::Boolean(v))
}

/// Standard base64 with optional padding (RFC 9651 §4.2.7 lets a parser
/// accept missing padding).
fn base64(text: &[u8]) -> Option<Vec<u8>> {
    let text = match text.iter().position(|&c| c == b'=') {
        Some(pad) => {
            // Padding only at the end, at most two, to a multiple of four.
            let tail = &text[pad..];
            if tail.len() > 2 || tail.iter().any(|&c| c != b'=') || !text.len().is_multiple_of(4) {
                return None;
            }
            &text[..pad]
        }
        None => text,
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    for chunk in text.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | value(c)?;
        }
        let bits = chunk.len() * 6;
        acc <<= 24 - bits;
        let [_, a, b, c] = acc.to_be_bytes();
        out.extend_from_slice(&[a, b, c][..bits / 8]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(input: &str) -> Member {
        let mut list = parse_list(input.as_bytes()).unwrap();
        assert_eq!(list.len(), 1, "{input}");
        list.remove(0)
    }

    #[test]
    fn items_and_parameters_of_every_kind() {
        let m = one(r#""default";r=50;t=30;pk=:Y2xpZW50LTE=:;x="a\"b";y=?0;z=1.5;w"#);
        assert_eq!(m.item, Some(Bare::String("default".into())));
        assert_eq!(m.param("r"), Some(&Bare::Integer(50)));
        assert_eq!(m.param("t"), Some(&Bare::Integer(30)));
        assert_eq!(m.param("pk"), Some(&Bare::Bytes(b"client-1".to_vec())));
        assert_eq!(m.param("x"), Some(&Bare::String("a\"b".into())));
        assert_eq!(m.param("y"), Some(&Bare::Boolean(false)));
        assert_eq!(m.param("z"), Some(&Bare::Decimal(1.5)));
        assert_eq!(m.param("w"), Some(&Bare::Boolean(true)));
        let m = one("burst;q=-3");
        assert_eq!(m.item, Some(Bare::Token("burst".into())));
        assert_eq!(m.param("q"), Some(&Bare::Integer(-3)));
    }

    #[test]
    fn lists_inner_lists_and_whitespace() {
        let list = parse_list(b"  a;q=1 ,\tb;q=2, (x y);q=3, @1700000000, %\"caf%c3%a9\"").unwrap();
        assert_eq!(list.len(), 5);
        assert_eq!(list[2].item, None);
        assert_eq!(list[2].param("q"), Some(&Bare::Integer(3)));
        assert_eq!(list[3].item, Some(Bare::Other));
        assert!(parse_list(b"").unwrap().is_empty());
    }

    #[test]
    fn malformed_fields_are_errors() {
        for bad in [
            "a,",
            "a;Q=1",
            "a;q=1234567890123456",
            "\"open",
            "a b",
            "a;q=1.2345",
            "a;pk=:!!:",
            "a;pk=:abc",
            "?2",
            ",",
            "a;q=--1",
            "a;q=.5",
            "\"caf\u{e9}\"",
        ] {
            assert!(parse_list(bad.as_bytes()).is_err(), "{bad:?} parsed");
        }
        let long = "a, ".repeat(MAX_MEMBERS + 1);
        assert!(parse_list(long.trim_end_matches([',', ' ']).as_bytes()).is_err());
    }

    #[test]
    fn base64_with_and_without_padding() {
        assert_eq!(base64(b"Zm9vYg==").unwrap(), b"foob");
        assert_eq!(base64(b"Zm9vYg").unwrap(), b"foob");
        assert_eq!(base64(b"Zm9v").unwrap(), b"foo");
        assert_eq!(base64(b"").unwrap(), b"");
        assert!(base64(b"Z").is_none());
        assert!(base64(b"Zm=v").is_none());
    }
}
