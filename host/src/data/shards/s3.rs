//! S3 (and S3-compatible) object storage as a [`Remote`]: `data_dir = "s3://bucket/prefix"`.
//!
//! Objects are read with `object_store`'s `AmazonS3`, configured from the standard AWS
//! environment as `AmazonS3Builder::from_env` reads it (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT_URL` / `AWS_ENDPOINT` / `AWS_ENDPOINT_URL_S3`, `AWS_ALLOW_HTTP`,
//! `AWS_SKIP_SIGNATURE`, `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`, `AWS_TIMEOUT`, ...; without keys,
//! the web-identity, container and instance credentials). Plain `http://` is allowed for an
//! endpoint on the loopback address, or anywhere with `AWS_ALLOW_HTTP=true`. Requests are
//! retried a few times with a bounded exponential backoff; errors name the object's
//! `s3://bucket/key` and the reason.
//!
//! The store's futures run on a small tokio runtime the remote owns, blocked on from the
//! shard cache's threads (the loader's and the prefetcher's), which run no runtime of their own.

use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use futures_util::StreamExt as _;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStoreExt as _, RetryConfig};

use super::cache::Remote;
use crate::data::DataError;

/// The request retries (after the first try) on a connection error, a timeout or a 5xx/429
/// answer.
const RETRIES: usize = 4;

/// One request's time limit when `AWS_TIMEOUT` does not set one: a whole shard (64 MB by
/// default) must arrive within it.
const TIMEOUT: &str = "300s";

/// An S3 bucket and key prefix read as a [`Remote`] (see the module docs).
#[derive(Debug)]
pub struct S3Remote {
    bucket: String,
    /// The prefix without leading or trailing `/` (empty for the bucket's root).
    prefix: String,
    store: AmazonS3,
    runtime: tokio::runtime::Runtime,
}

/// The bucket and the prefix (without surrounding `/`) of `s3://bucket/prefix`; the reason
/// when `url` is not such a URL.
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let bad = |why: &str| format!("{why}; expected s3://BUCKET or s3://BUCKET/PREFIX");
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("not an s3:// URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket name"));
    }
    // S3's bucket names: 3 to 63 lowercase letters, digits, dots and hyphens (S3-compatible
    // stores may allow more; only what cannot be a URL's host is refused here).
    if let Some(c) = bucket
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(bad(&format!("the bucket name `{bucket}` holds {c:?}")));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        ObjectPath::parse(prefix).map_err(|e| bad(&format!("the prefix `{prefix}`: {e}")))?;
    }
    Ok((bucket.to_owned(), prefix.to_owned()))
}

/// Whether `endpoint` is an `http://` URL whose host is a loopback address (or `localhost`).
fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl S3Remote {
    /// The objects under `url` (`s3://bucket/prefix`), configured from the AWS environment.
    pub fn new(url: &str) -> Result<S3Remote, DataError> {
        S3Remote::with_builder(url, AmazonS3Builder::from_env())
    }

    /// The objects under `url`, the client configured by `builder` (its bucket, retries and
    /// timeout set here).
    fn with_builder(url: &str, builder: AmazonS3Builder) -> Result<S3Remote, DataError> {
        let (bucket, prefix) = parse_url(url)
            .map_err(|e| DataError::Invalid(format!("data.data_dir = {url:?}: {e}")))?;
        let mut builder = builder.with_bucket_name(&bucket).with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: RETRIES,
            retry_timeout: Duration::from_secs(120),
        });
        let endpoint = builder
            .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
        if endpoint.as_deref().is_some_and(is_loopback_http) {
            builder = builder.with_allow_http(true);
        }
        let timeout = AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
        if builder.get_config_value(&timeout).is_none() {
            builder = builder.with_config(timeout, TIMEOUT);
        }
        let store = builder.build().map_err(|e| {
            DataError::Invalid(format!(
                "{url}: the S3 client cannot be configured from the AWS_* environment variables: {}",
                chain(&e)
            ))
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3-io")
            .enable_all()
            .build()
            .map_err(|e| {
                DataError::Invalid(format!("{url}: starting the S3 client's threads: {e}"))
            })?;
        Ok(S3Remote {
            bucket,
            prefix,
            store,
            runtime,
        })
    }

    /// The object key of `key` (relative to the prefix).
    fn full_key(&self, key: &str) -> String {
        let key = key.trim_start_matches('/');
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    /// `error` of a request for `url` as a [`DataError`] naming the object and the reason.
    fn error(&self, url: &str, error: &object_store::Error) -> DataError {
        use object_store::Error as E;
        let detail = chain(error);
        let reason = match error {
            E::NotFound { .. } if detail.contains("NoSuchBucket") => {
                format!("no such bucket `{}`", self.bucket)
            }
            E::NotFound { .. } => "no such object".to_owned(),
            E::PermissionDenied { .. } => format!(
                "access denied (check the credentials in AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY and the bucket's policy): {detail}"
            ),
            E::Unauthenticated { .. } => format!(
                "not authenticated (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
                 AWS_SKIP_SIGNATURE=true for a public bucket): {detail}"
            ),
            _ => detail,
        };
        DataError::Invalid(format!("{url}: {reason}"))
    }

    /// Runs `future` to completion on the remote's runtime.
    fn block_on<T>(
        &self,
        url: &str,
        future: impl std::future::Future<Output = Result<T, DataError>>,
    ) -> Result<T, DataError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking a runtime's own thread would stall it (and tokio refuses it).
            return Err(DataError::Invalid(format!(
                "{url}: an S3 shard was read from inside an async runtime; read it from a plain thread"
            )));
        }
        self.runtime.block_on(future)
    }
}

/// An error and its sources, `: `-separated (object_store's own messages are terse).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

impl Remote for S3Remote {
    fn url(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.full_key(key))
    }

    fn fetch(&self, key: &str, out: &mut dyn Write) -> Result<u64, DataError> {
        let url = self.url(key);
        let path = ObjectPath::parse(self.full_key(key))
            .map_err(|e| DataError::Invalid(format!("{url}: not an object key: {e}")))?;
        self.block_on(&url, async {
            let got = self
                .store
                .get(&path)
                .await
                .map_err(|e| self.error(&url, &e))?;
            let mut stream = got.into_stream();
            let mut bytes = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.error(&url, &e))?;
                out.write_all(&chunk).map_err(|e| {
                    DataError::Invalid(format!("{url}: writing it to the shard cache: {e}"))
                })?;
                bytes += chunk.len() as u64;
            }
            Ok(bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_into_a_bucket_and_a_prefix() {
        let ok = |u: &str| parse_url(u).unwrap_or_else(|e| panic!("{u}: {e}"));
        assert_eq!(ok("s3://bucket"), ("bucket".into(), String::new()));
        assert_eq!(ok("s3://bucket/"), ("bucket".into(), String::new()));
        assert_eq!(
            ok("s3://my-bucket.data/some/prefix/"),
            ("my-bucket.data".into(), "some/prefix".into())
        );
        for (bad, why) in [
            ("s3://", "no bucket name"),
            ("s3:///x", "no bucket name"),
            ("s3://bu cket/x", "the bucket name `bu cket` holds ' '"),
            ("gs://bucket/x", "not an s3:// URL"),
            ("s3://bucket/a//b", "the prefix `a//b`"),
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(
                e.contains(why) && e.contains("s3://BUCKET/PREFIX"),
                "{bad}: {e}"
            );
            // The remote names the key.
            let e = S3Remote::new(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("data.data_dir = {bad:?}: {why}")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn plain_http_is_allowed_on_the_loopback_address_only() {
        for yes in [
            "http://127.0.0.1:9000",
            "http://localhost:9000/",
            "http://[::1]:9000",
            "http://127.0.0.2",
            "http://user@127.0.0.1:1",
        ] {
            assert!(is_loopback_http(yes), "{yes}");
        }
        for no in [
            "https://127.0.0.1:9000",
            "http://10.0.0.1:9000",
            "http://s3.example.com",
            "http://127.0.0.1.example.com",
        ] {
            assert!(!is_loopback_http(no), "{no}");
        }
    }

    #[test]
    fn object_urls_join_the_prefix_and_the_key() {
        let remote = S3Remote::new("s3://bucket/a/b/").unwrap();
        assert_eq!(
            remote.url("train/index.json"),
            "s3://bucket/a/b/train/index.json"
        );
        let root = S3Remote::new("s3://bucket").unwrap();
        assert_eq!(
            root.url("val/shard.00000.mds"),
            "s3://bucket/val/shard.00000.mds"
        );
    }

    /// An HTTP server on the loopback address answering its first `answers.len()` requests
    /// with `answers` in turn (one connection each); the request lines it got.
    fn serve(answers: Vec<String>) -> (u16, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead as _, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let thread = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for answer in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                requests.push(line.trim().to_owned());
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap() == 0 || header == "\r\n" {
                        break;
                    }
                }
                reader.get_mut().write_all(answer.as_bytes()).unwrap();
            }
            requests
        });
        (port, thread)
    }

    fn answer(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}",
            body.len()
        )
    }

    fn local_remote(url: &str, port: u16) -> S3Remote {
        let builder = AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{port}"))
            .with_region("us-east-1")
            .with_access_key_id("key")
            .with_secret_access_key("secret");
        S3Remote::with_builder(url, builder).unwrap()
    }

    #[test]
    fn a_failed_request_is_retried_and_a_missing_object_is_named() {
        let object = "Last-Modified: Wed, 02 Dec 2026 05:00:00 GMT\r\nETag: \"e1\"\r\n";
        let missing = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
        let no_bucket = "<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code></Error>";
        let (port, server) = serve(vec![
            answer("503 Service Unavailable", "", ""),
            answer("200 OK", object, "shard bytes"),
            answer(
                "404 Not Found",
                "Content-Type: application/xml\r\n",
                missing,
            ),
            answer(
                "404 Not Found",
                "Content-Type: application/xml\r\n",
                no_bucket,
            ),
        ]);
        let remote = local_remote("s3://bucket/data", port);
        // The 503 is retried: the object arrives whole.
        assert_eq!(remote.get("train/a.mds").unwrap(), b"shard bytes");
        let e = remote.get("train/b.mds").unwrap_err().to_string();
        assert_eq!(e, "s3://bucket/data/train/b.mds: no such object");
        let e = remote.get("train/index.json").unwrap_err().to_string();
        assert_eq!(
            e,
            "s3://bucket/data/train/index.json: no such bucket `bucket`"
        );
        // Path-style requests for the objects' keys.
        assert_eq!(
            server.join().unwrap(),
            [
                "GET /bucket/data/train/a.mds HTTP/1.1",
                "GET /bucket/data/train/a.mds HTTP/1.1",
                "GET /bucket/data/train/b.mds HTTP/1.1",
                "GET /bucket/data/train/index.json HTTP/1.1",
            ]
        );
    }

    #[test]
    fn access_denied_is_named_with_the_object() {
        let denied = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code></Error>";
        let (port, server) = serve(vec![answer("403 Forbidden", "", denied)]);
        let remote = local_remote("s3://bucket", port);
        let e = remote.get("val/index.json").unwrap_err().to_string();
        assert!(
            e.starts_with("s3://bucket/val/index.json: access denied")
                && e.contains("AccessDenied"),
            "{e}"
        );
        server.join().unwrap();
    }

    #[test]
    fn each_url_has_its_own_default_cache_folder() {
        let root = std::path::Path::new("/cache");
        let a = super::super::default_remote_cache(root, "s3://bucket/a/b");
        assert!(a.starts_with("/cache/shards"), "{}", a.display());
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("bucket_a_b-") && name.len() == "bucket_a_b-".len() + 8,
            "{name}"
        );
        // A trailing `/` names the same dataset; `_` for `/` does not.
        assert_eq!(
            a,
            super::super::default_remote_cache(root, "s3://bucket/a/b/")
        );
        assert_ne!(
            a,
            super::super::default_remote_cache(root, "s3://bucket/a_b")
        );
    }
}
