//! A live sandbox's terminal over a WebSocket (`terminalUrl`, issue #46),
//! against a real gateway and node agent with a real WebSocket client: the
//! URL create answers opens an interactive shell on the sandbox's own
//! terminal; keystrokes go in, what it shows comes out, a resize reaches
//! it; the shell's exit closes the socket; no token, another sandbox's
//! token or a paused sandbox opens nothing.

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::http::request;
use warren_e2e::{skip_unless_root, Agent};

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Reads binary frames until what the terminal showed holds `want`.
async fn read_until(ws: &mut Socket, want: &str) -> String {
    read_while(ws, want, |seen| seen.contains(want)).await
}

/// Reads until `want` and, after it, the shell's next prompt: readline
/// has then set the terminal up (it reads the size and writes it back,
/// which would undo a resize landing between the two).
async fn read_to_prompt_after(ws: &mut Socket, want: &str) -> String {
    read_while(ws, want, |seen| seen.find(want).is_some_and(|i| seen[i..].trim_end_matches(' ').ends_with(['$', '#']))).await
}

async fn read_while(ws: &mut Socket, want: &str, done: impl Fn(&str) -> bool) -> String {
    let mut seen = String::new();
    let read = async {
        while !done(&seen) {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => seen.push_str(&String::from_utf8_lossy(&b)),
                Some(Ok(Message::Close(c))) => panic!("closed ({c:?}) before {want:?}: {seen:?}"),
                Some(Ok(_)) => {}
                other => panic!("{other:?} before {want:?}: {seen:?}"),
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), read).await.unwrap_or_else(|_| panic!("no {want:?} in {seen:?}"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_over_a_websocket_types_reads_resizes_and_ends() {
    if skip_unless_root("a_terminal_over_a_websocket_types_reads_resizes_and_ends") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let bearer = format!("Bearer {}", key("thr"));
    let create = |body: &[u8]| request(gw.addr, "POST", "/sandboxes", &[("Authorization", bearer.as_str()), ("Content-Type", "application/json")], body);
    let made = create(br#"{"templateID": "base", "timeout": 120}"#);
    assert_eq!(made.status, 201, "{}", made.text());
    let v = made.json();
    let (id, url) = (v["sandboxID"].as_str().unwrap().to_string(), v["terminalUrl"].as_str().unwrap().to_string());
    assert!(url.starts_with(&format!("/sandboxes/{id}/terminal?warren_token=")), "{url}");

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}{url}&rows=24&cols=80", gw.addr)).await.unwrap();
    ws.send(Message::Binary(b"tty; stty size; echo $((6*7))\n".to_vec().into())).await.unwrap();
    let shown = read_to_prompt_after(&mut ws, "42").await;
    assert!(shown.contains("/dev/pts/0") && shown.contains("24 80"), "{shown:?}");
    ws.send(Message::Text(r#"{"resize": [40, 100]}"#.into())).await.unwrap();
    ws.send(Message::Text(r#"{"input": "stty size\n"}"#.into())).await.unwrap();
    read_until(&mut ws, "40 100").await;
    ws.send(Message::Binary(b"exit 3\n".to_vec().into())).await.unwrap();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(c))) => return c.map(|c| c.reason.to_string()),
                Some(Ok(_)) => continue,
                other => panic!("{other:?}"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(closed.as_deref(), Some("exit 3"));

    // Refused: no token, another sandbox's token, a token of another kind.
    let other = create(br#"{"templateID": "base", "timeout": 120}"#).json();
    let other_url = other["terminalUrl"].as_str().unwrap();
    let theirs = other_url.split("warren_token=").nth(1).unwrap();
    for bad in [format!("/sandboxes/{id}/terminal"), format!("/sandboxes/{id}/terminal?warren_token={theirs}"), format!("/sandboxes/{id}/terminal?warren_token={}", v["envdAccessToken"].as_str().unwrap())] {
        let refused = tokio_tungstenite::connect_async(format!("ws://{}{bad}", gw.addr)).await;
        assert!(refused.is_err(), "{bad} opened a terminal");
    }
    // A paused sandbox's terminal does not open.
    let paused = request(gw.addr, "POST", &format!("/sandboxes/{id}/pause"), &[("Authorization", bearer.as_str())], b"");
    assert_eq!(paused.status, 204, "{}", paused.text());
    assert!(tokio_tungstenite::connect_async(format!("ws://{}{url}", gw.addr)).await.is_err());
}
