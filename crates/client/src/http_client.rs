//! A small HTTP/1.1 client over hyper for talking to any OpenAI-compatible server (ours, SGLang, vLLM,
//! llama.cpp): URL parsing, one re-opened keep-alive connection, whole bodies and SSE `data:` payloads.
//! Shared by `bench serve` and `smoke`; it knows nothing about what the requests mean.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// A URL that is not a plain `http://host[:port][/prefix]` server root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--url {url:?}: {reason}")]
pub struct UrlError {
    pub url: String,
    pub reason: String,
}

/// A parsed `http://host:port/prefix` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host:port` to connect to and send as `Host`.
    pub authority: String,
    /// Path prefix without a trailing slash (usually empty); a trailing `/v1` is dropped.
    pub prefix: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let error = |reason: &str| UrlError {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| error("only http:// URLs are supported"))?;
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() {
            return Err(error("no host"));
        }
        let authority = if authority.contains(':') && !authority.ends_with(']') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let mut prefix = format!("/{}", path.trim_end_matches('/'));
        if prefix.ends_with("/v1") {
            prefix.truncate(prefix.len() - 3);
        }
        if prefix == "/" {
            prefix.clear();
        }
        Ok(Self {
            authority,
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }
}

/// An HTTP/1.1 connection that is re-opened when the server closes it.
pub struct Connection {
    pub target: Target,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    pub fn new(target: Target) -> Self {
        Self {
            target,
            sender: None,
        }
    }

    async fn sender(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        let usable = match &mut self.sender {
            Some(sender) => sender.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            let stream = tokio::net::TcpStream::connect(&self.target.authority)
                .await
                .map_err(|e| format!("connect {}: {e}", self.target.authority))?;
            let _ = stream.set_nodelay(true);
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP handshake: {e}"))?;
            tokio::spawn(connection);
            self.sender = Some(sender);
        }
        self.sender
            .as_mut()
            .ok_or_else(|| "no connection".to_string())
    }

    /// Sends a request; returns the status and the response body.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, hyper::body::Incoming), String> {
        let uri = format!("{}{}", self.target.prefix, path);
        let authority = self.target.authority.clone();
        let payload = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", authority)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(payload))
            .map_err(|e| format!("building the request: {e}"))?;
        let sender = self.sender().await?;
        match sender.send_request(request).await {
            Ok(response) => Ok((response.status().as_u16(), response.into_body())),
            Err(e) => {
                self.sender = None;
                Err(format!("request failed: {e}"))
            }
        }
    }

    /// Sends a request and reads the whole answer as text.
    pub async fn send_text(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), String> {
        let (status, body) = self.send(method, path, body).await?;
        Ok((status, body_text(body).await?))
    }
}

/// Reads a whole response body as text.
pub async fn body_text(body: hyper::body::Incoming) -> Result<String, String> {
    body.collect()
        .await
        .map(|collected| String::from_utf8_lossy(&collected.to_bytes()).into_owned())
        .map_err(|e| format!("reading the body: {e}"))
}

/// Splits server-sent events out of a growing buffer: returns the `data:` payloads of every complete
/// event (`\n\n`-terminated; `\r\n` line ends are accepted) and leaves the incomplete rest in `buffer`.
pub fn drain_sse_payloads(buffer: &mut String) -> Vec<String> {
    if buffer.contains('\r') {
        *buffer = buffer.replace("\r\n", "\n");
    }
    let mut payloads = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let event: String = buffer.drain(..end + 2).collect();
        for line in event.lines() {
            if let Some(payload) = line.strip_prefix("data:") {
                payloads.push(payload.trim().to_string());
            }
        }
    }
    payloads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let t = Target::parse("http://127.0.0.1:30000").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.prefix.as_str()),
            ("127.0.0.1:30000", "")
        );
        let t = Target::parse("http://localhost:8000/v1/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.prefix.as_str()),
            ("localhost:8000", "")
        );
        let t = Target::parse("http://host/proxy/v1").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.prefix.as_str()),
            ("host:80", "/proxy")
        );
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("http:///v1").is_err());
    }

    #[test]
    fn sse_payloads_across_reads() {
        let mut buffer = "data: {\"a\":1}\n\ndata: [DO".to_string();
        assert_eq!(drain_sse_payloads(&mut buffer), ["{\"a\":1}"]);
        buffer.push_str("NE]\r\n\r\n: comment\n\n");
        assert_eq!(drain_sse_payloads(&mut buffer), ["[DONE]"]);
        assert!(buffer.is_empty());
    }
}
