//! The console's HTML, escaped by construction: text reaches a page only
//! through [`Html::text`] (or [`Html::attr`]), so program output, metadata
//! and object names render as text, never as markup. Pages carry no inline
//! script or style: the [`SECURITY_HEADERS`] forbid both.

use std::fmt::Write as _;

/// Headers on every console response. The policy allows the console's own
/// embedded assets only: no inline script or style, no other origin, no
/// framing, forms posting back to the console only.
pub const SECURITY_HEADERS: [(&str, &str); 6] = [
    ("content-security-policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("cross-origin-opener-policy", "same-origin"),
];

/// Markup that is safe to send: built from escaped text and fixed tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Html(String);

impl Html {
    /// `s` as text.
    pub fn text(s: &str) -> Html {
        let mut out = Html(String::with_capacity(s.len()));
        out.push_text(s);
        out
    }

    /// `s` as the value of a double-quoted attribute (the same escaping:
    /// quotes included).
    pub fn attr(s: &str) -> Html {
        Html::text(s)
    }

    /// Appends `s` as text.
    pub fn push_text(&mut self, s: &str) {
        for c in s.chars() {
            match c {
                '&' => self.0.push_str("&amp;"),
                '<' => self.0.push_str("&lt;"),
                '>' => self.0.push_str("&gt;"),
                '"' => self.0.push_str("&quot;"),
                '\'' => self.0.push_str("&#39;"),
                // Control characters other than whitespace have no place in a page.
                c if c.is_control() && !matches!(c, '\n' | '\t' | '\r') => {
                    let _ = write!(self.0, "&#x{:x};", u32::from(c));
                }
                c => self.0.push(c),
            }
        }
    }

    /// Appends a fixed tag or fragment from this crate's source.
    pub fn push_markup(&mut self, s: &'static str) {
        self.0.push_str(s);
    }

    /// Appends other safe markup.
    pub fn push(&mut self, h: &Html) {
        self.0.push_str(&h.0);
    }

    /// The markup.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A table of `headers` and `rows` of cells.
pub fn table(headers: &[&'static str], rows: impl IntoIterator<Item = Vec<Html>>) -> Html {
    let mut h = Html::default();
    h.push_markup("<table><thead><tr>");
    for head in headers {
        h.push_markup("<th>");
        h.push_markup(head);
        h.push_markup("</th>");
    }
    h.push_markup("</tr></thead><tbody>");
    for row in rows {
        h.push_markup("<tr>");
        for cell in row {
            h.push_markup("<td>");
            h.push(&cell);
            h.push_markup("</td>");
        }
        h.push_markup("</tr>");
    }
    h.push_markup("</tbody></table>");
    h
}

/// A whole page: `title`, the signed-in user (if any: their name and
/// session's CSRF token, for the sign-out form) and `body`.
pub fn page(title: &str, user: Option<(&str, &str)>, body: &Html) -> Html {
    document(title, user, body, false)
}

/// A page that follows something running: with script, the console's
/// script updates it live (server-sent events); without, it reloads
/// itself every 2 s.
pub fn live_page(title: &str, user: Option<(&str, &str)>, body: &Html) -> Html {
    document(title, user, body, true)
}

fn document(title: &str, user: Option<(&str, &str)>, body: &Html, live: bool) -> Html {
    let mut h = Html::default();
    h.push_markup("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
    h.push_text(title);
    h.push_markup(" · Warren</title><link rel=\"stylesheet\" href=\"/assets/console.css\">");
    if live {
        h.push_markup("<noscript><meta http-equiv=\"refresh\" content=\"2\"></noscript><script src=\"/assets/console.js\" defer></script>");
    }
    h.push_markup("</head><body><header><strong>Warren</strong>");
    if let Some((user, csrf)) = user {
        h.push_markup("<nav><a href=\"/\">Overview</a><a href=\"/executions\">Executions</a><a href=\"/keys\">API keys</a><a href=\"/sandboxes\">Sandboxes</a><a href=\"/objects/sandboxes\">Objects</a><a href=\"/playground\">Playground</a><a href=\"/terminal\">Terminal</a><a href=\"/activity\">Activity</a></nav><span class=\"user\">");
        h.push_text(user);
        h.push_markup("</span><form method=\"post\" action=\"/signout\"><input type=\"hidden\" name=\"csrf\" value=\"");
        h.push(&Html::attr(csrf));
        h.push_markup("\"><button type=\"submit\">Sign out</button></form>");
    }
    h.push_markup("</header><main><h1>");
    h.push_text(title);
    h.push_markup("</h1>");
    h.push(body);
    h.push_markup("</main></body></html>");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_never_becomes_markup() {
        let attacks = [
            "<script>alert(1)</script>",
            "<img src=x onerror=alert(1)>",
            "\" onmouseover=\"alert(1)",
            "' autofocus onfocus='alert(1)",
            "</td></tr></table><script>",
            "&lt;script&gt;",
            "\u{1b}[31mred\u{0}",
        ];
        for a in attacks {
            let h = Html::text(a);
            for bad in ['<', '>', '"', '\'', '\u{1b}', '\u{0}'] {
                assert!(!h.as_str().contains(bad), "{a:?} → {}", h.as_str());
            }
        }
        assert_eq!(Html::text("&lt;").as_str(), "&amp;lt;", "already-escaped text is shown as typed");
        assert_eq!(Html::text("a\nb\tc").as_str(), "a\nb\tc");
    }

    #[test]
    fn pages_and_tables_escape_every_value_they_are_given() {
        let row = vec![Html::text("<b>trc_1</b>"), Html::text("print('<script>')")];
        let body = table(&["id", "code"], [row]);
        let p = page("<i>Executions</i>", Some(("\"ada\"@example.test", "tok\"en")), &body);
        let s = p.as_str();
        assert!(s.starts_with("<!doctype html>") && s.contains("<th>id</th>"));
        assert!(s.contains("&lt;b&gt;trc_1&lt;/b&gt;") && s.contains("print(&#39;&lt;script&gt;&#39;)"));
        assert!(s.contains("&lt;i&gt;Executions&lt;/i&gt;") && s.contains("&quot;ada&quot;@example.test") && s.contains("value=\"tok&quot;en\""));
        assert!(!s.contains("<script") && !s.contains("<i>") && !s.contains("style="), "{s}");
    }

    #[test]
    fn the_policy_forbids_inline_code_and_other_origins() {
        let csp = SECURITY_HEADERS.iter().find(|(k, _)| *k == "content-security-policy").unwrap().1;
        assert!(csp.starts_with("default-src 'none'"));
        for forbidden in ["unsafe-inline", "unsafe-eval", "*", "http:", "https:", "data:"] {
            assert!(!csp.contains(forbidden), "{forbidden}");
        }
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'self'"));
    }
}
