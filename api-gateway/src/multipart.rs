//! `multipart/form-data` bodies (the console's upload form, E2B's file
//! uploads), read from a body the caller already bounded. Browsers send no preamble and quote the
//! header parameters; anything else is refused with a reason, never guessed.

use axum::body::Bytes;
use memchr::memmem;

/// Most parts one form may carry (csrf, path, file).
const MAX_PARTS: usize = 8;
/// Largest header block of one part.
const MAX_HEADERS: usize = 4096;

/// One field of the form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The field's name.
    pub name: String,
    /// The file's name, for a file field.
    pub filename: Option<String>,
    /// Its bytes (a slice of the body: no copy).
    pub data: Bytes,
}

/// The boundary of a `multipart/form-data` Content-Type (1–70 characters, RFC 2046).
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let b = params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim().eq_ignore_ascii_case("boundary").then(|| v.trim().trim_matches('"').to_string())
    })?;
    (1..=70).contains(&b.len()).then_some(b).filter(|b| b.bytes().all(|c| c.is_ascii_graphic() || c == b' '))
}

/// The parts of `body`, in order.
pub fn parse(body: &Bytes, boundary: &str) -> Result<Vec<Part>, &'static str> {
    let open = format!("--{boundary}");
    let between = format!("\r\n--{boundary}");
    if !body.starts_with(open.as_bytes()) {
        return Err("the form does not start with its boundary");
    }
    let mut at = open.len();
    let mut parts = Vec::new();
    loop {
        match body.get(at..at + 2) {
            Some(b"--") => return Ok(parts),
            Some(b"\r\n") => at += 2,
            _ => return Err("a boundary is not followed by a line end"),
        }
        if parts.len() == MAX_PARTS {
            return Err("the form has too many fields");
        }
        let rest = &body[at..];
        let head_len = memmem::find(&rest[..rest.len().min(MAX_HEADERS + 4)], b"\r\n\r\n").ok_or("a field's headers do not end")?;
        let head = std::str::from_utf8(&rest[..head_len]).map_err(|_| "a field's headers are not UTF-8")?;
        let data_at = at + head_len + 4;
        let len = memmem::find(&body[data_at..], between.as_bytes()).ok_or("the form does not end with its boundary")?;
        let (name, filename) = disposition(head)?;
        parts.push(Part { name, filename, data: body.slice(data_at..data_at + len) });
        at = data_at + len + between.len();
    }
}

/// The `name` and `filename` of a part's Content-Disposition.
fn disposition(head: &str) -> Result<(String, Option<String>), &'static str> {
    let line = head
        .split("\r\n")
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition")).map(|(_, v)| v))
        .ok_or("a field has no Content-Disposition")?;
    let mut params = line.split(';').map(str::trim);
    if params.next() != Some("form-data") {
        return Err("a field is not form-data");
    }
    let (mut name, mut filename) = (None, None);
    for p in params {
        let Some((k, v)) = p.split_once('=') else { continue };
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).ok_or("a field's parameters are not quoted")?;
        match k.trim() {
            "name" => name = Some(v.to_string()),
            "filename" => filename = Some(v.to_string()),
            _ => {}
        }
    }
    let name = name.filter(|n| !n.is_empty() && n.len() <= 64).ok_or("a field has no name")?;
    Ok((name, filename.filter(|f| f.len() <= 255)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(parts: &[(&str, Option<&str>, &[u8])]) -> Bytes {
        let mut b = Vec::new();
        for (name, file, data) in parts {
            b.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"");
            b.extend_from_slice(name.as_bytes());
            b.push(b'"');
            if let Some(f) = file {
                b.extend_from_slice(format!("; filename=\"{f}\"\r\nContent-Type: application/octet-stream").as_bytes());
            }
            b.extend_from_slice(b"\r\n\r\n");
            b.extend_from_slice(data);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"--XyZ--\r\n");
        Bytes::from(b)
    }

    #[test]
    fn reads_a_browsers_upload_form_with_binary_content() {
        assert_eq!(boundary("multipart/form-data; boundary=----WebKitFormBoundaryabc").as_deref(), Some("----WebKitFormBoundaryabc"));
        assert_eq!(boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(), Some("XyZ"));
        assert_eq!(boundary("application/x-www-form-urlencoded"), None);
        assert_eq!(boundary(&format!("multipart/form-data; boundary={}", "x".repeat(71))), None);
        let data: &[u8] = b"\r\n--Xy\r\n\0\xff binary\r\n";
        let parts = parse(&form(&[("csrf", None, b"tok"), ("file", Some("a.bin"), data)]), "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!((parts[0].name.as_str(), parts[0].filename.as_deref(), &parts[0].data[..]), ("csrf", None, &b"tok"[..]));
        assert_eq!((parts[1].name.as_str(), parts[1].filename.as_deref(), &parts[1].data[..]), ("file", Some("a.bin"), data));
        assert_eq!(parse(&form(&[("file", Some("empty"), b"")]), "XyZ").unwrap()[0].data.len(), 0);
    }

    #[test]
    fn refuses_malformed_and_oversized_forms() {
        let ok = form(&[("csrf", None, b"tok")]);
        assert!(parse(&ok, "Other").is_err(), "wrong boundary");
        assert!(parse(&ok.slice(..ok.len() - 9), "XyZ").is_err(), "no closing boundary");
        let many: Vec<(&str, Option<&str>, &[u8])> = (0..9).map(|_| ("f", None, &b"x"[..])).collect();
        assert_eq!(parse(&form(&many), "XyZ"), Err("the form has too many fields"));
        let long_head = Bytes::from(format!("--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\nX: {}\r\n\r\nv\r\n--XyZ--", "y".repeat(5000)));
        assert!(parse(&long_head, "XyZ").is_err(), "headers are bounded");
        let unquoted = Bytes::from_static(b"--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nv\r\n--XyZ--");
        assert!(parse(&unquoted, "XyZ").is_err());
        let nameless = Bytes::from_static(b"--XyZ\r\nContent-Type: text/plain\r\n\r\nv\r\n--XyZ--");
        assert!(parse(&nameless, "XyZ").is_err());
    }
}
