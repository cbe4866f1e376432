//! A blocking client of MLflow's REST API 2.0 (tracking server 2.x and 3.x): the few calls a
//! run needs, with MLflow's errors kept apart from an unreachable server.

use std::time::Duration;

use serde_json::{json, Value};

use super::convert::{KeyValue, Metric};

/// Calls to the server connect within this time…
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// …and each answer must start within this one (a large upload is sent before it counts).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest artifact [`Client::download_artifact`] reads.
const MAX_DOWNLOAD_BYTES: u64 = 1 << 30;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// No answer: the server is down, unreachable or too slow. Worth retrying.
    #[error("{0}")]
    Unreachable(String),
    /// The server answered with an error.
    #[error("HTTP {status} from {endpoint}: {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// MLflow's `error_code` (`RESOURCE_DOES_NOT_EXIST`, ...), when it gave one.
        code: Option<String>,
        /// The call.
        endpoint: String,
        /// MLflow's message, or the start of the body.
        message: String,
    },
    /// The answer is not what the API documents.
    #[error("{0}")]
    BadAnswer(String),
}

impl ApiError {
    /// Whether trying again later may succeed: no answer, a server error or rate limiting.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Unreachable(_) => true,
            ApiError::Refused { status, .. } => *status >= 500 || *status == 429,
            ApiError::BadAnswer(_) => false,
        }
    }

    fn code_is(&self, wanted: &str) -> bool {
        matches!(self, ApiError::Refused { code: Some(c), .. } if c == wanted)
    }
}

/// A run as the server created or reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// MLflow's run id.
    pub run_id: String,
    /// The experiment's id.
    pub experiment_id: String,
    /// Where its artifacts go (`mlflow-artifacts:/1/<run id>/artifacts` on a server that
    /// proxies artifacts).
    pub artifact_uri: String,
}

/// The client of one tracking server.
pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client of the server at `base` (checked by [`super::check_uri`]); sends
    /// `MLFLOW_TRACKING_TOKEN`, when set, as a bearer token, as MLflow's own client does.
    pub fn new(base: &str) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(ANSWER_TIMEOUT))
            .timeout_recv_body(Some(ANSWER_TIMEOUT))
            .user_agent(concat!("tessera/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Client {
            agent,
            base: base.to_owned(),
            token: std::env::var("MLFLOW_TRACKING_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, endpoint: &str) -> String {
        format!("{}/api/2.0/{endpoint}", self.base)
    }

    fn authorized<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(token) => request.header("Authorization", format!("Bearer {token}")),
            None => request,
        }
    }

    /// `POST /api/2.0/<endpoint>` with a JSON body; the JSON answer.
    fn post(&self, endpoint: &str, body: &Value) -> Result<Value, ApiError> {
        let request = self.authorized(self.agent.post(self.url(endpoint)));
        json_answer(endpoint, request.send_json(body))
    }

    /// `GET /api/2.0/<endpoint>?query`; the JSON answer.
    fn get(&self, endpoint: &str, query: &[(&str, &str)]) -> Result<Value, ApiError> {
        let mut request = self.authorized(self.agent.get(self.url(endpoint)));
        for (k, v) in query {
            request = request.query(*k, *v);
        }
        json_answer(endpoint, request.call())
    }

    /// The id of experiment `name`, created when missing.
    pub fn experiment_id(&self, name: &str) -> Result<String, ApiError> {
        let found = self.get(
            "mlflow/experiments/get-by-name",
            &[("experiment_name", name)],
        );
        let experiment = match found {
            Ok(answer) => answer["experiment"].clone(),
            Err(e) if e.code_is("RESOURCE_DOES_NOT_EXIST") => {
                match self.post("mlflow/experiments/create", &json!({ "name": name })) {
                    Ok(answer) => return string_field(&answer, "experiment_id"),
                    // Another run created it meanwhile.
                    Err(e) if e.code_is("RESOURCE_ALREADY_EXISTS") => {
                        return self.experiment_id(name)
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if experiment["lifecycle_stage"] == "deleted" {
            return Err(ApiError::BadAnswer(format!(
                "experiment {name:?} is deleted on the server (restore it, or name another)"
            )));
        }
        string_field(&experiment, "experiment_id")
    }

    /// Creates a run named `run_name` in `experiment_id`, started at `start_ms`.
    pub fn create_run(
        &self,
        experiment_id: &str,
        run_name: &str,
        start_ms: i64,
    ) -> Result<RunInfo, ApiError> {
        let answer = self.post(
            "mlflow/runs/create",
            &json!({
                "experiment_id": experiment_id,
                "run_name": run_name,
                "start_time": start_ms,
            }),
        )?;
        run_info(&answer["run"])
    }

    /// The run `run_id`: its info and its parameters.
    pub fn get_run(&self, run_id: &str) -> Result<(RunInfo, Vec<KeyValue>), ApiError> {
        let answer = self.get("mlflow/runs/get", &[("run_id", run_id)])?;
        let run = &answer["run"];
        let params = run["data"]["params"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        Some(KeyValue {
                            key: p["key"].as_str()?.to_owned(),
                            value: p["value"].as_str().unwrap_or_default().to_owned(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok((run_info(run)?, params))
    }

    /// Logs parameters, tags and metrics in one call (within MLflow's batch limits: the caller
    /// keeps them).
    pub fn log_batch(
        &self,
        run_id: &str,
        params: &[KeyValue],
        tags: &[KeyValue],
        metrics: &[Metric],
    ) -> Result<(), ApiError> {
        self.post(
            "mlflow/runs/log-batch",
            &json!({"run_id": run_id, "params": params, "tags": tags, "metrics": metrics}),
        )
        .map(drop)
    }

    /// Sets the run's status (`RUNNING`, `FINISHED`, `FAILED`, `KILLED`) and end time.
    pub fn update_run(
        &self,
        run_id: &str,
        status: &str,
        end_ms: Option<i64>,
    ) -> Result<(), ApiError> {
        let mut body = json!({"run_id": run_id, "status": status});
        if let Some(end) = end_ms {
            body["end_time"] = json!(end);
        }
        self.post("mlflow/runs/update", &body).map(drop)
    }

    /// The runs of `experiment_id`, newest first, every page.
    pub fn search_runs(&self, experiment_id: &str) -> Result<Vec<Value>, ApiError> {
        let mut runs = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut body = json!({
                "experiment_ids": [experiment_id],
                "max_results": 1000,
                "order_by": ["attributes.start_time DESC"],
            });
            if let Some(token) = &page_token {
                body["page_token"] = json!(token);
            }
            let answer = self.post("mlflow/runs/search", &body)?;
            if let Some(page) = answer["runs"].as_array() {
                runs.extend(page.iter().cloned());
            }
            page_token = answer["next_page_token"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            if page_token.is_none() {
                return Ok(runs);
            }
        }
    }

    /// The proxy URL of artifact `name` under `artifact_uri`, or why there is none: only
    /// `mlflow-artifacts:` URIs (a server that serves artifacts) can be reached over HTTP.
    fn artifact_url(&self, artifact_uri: &str, name: &str) -> Result<String, ApiError> {
        let rest = artifact_uri
            .strip_prefix("mlflow-artifacts:")
            .ok_or_else(|| {
                ApiError::BadAnswer(format!(
                    "the server stores this run's artifacts at {artifact_uri}, which its REST API \
                 does not reach (start `mlflow server` with artifact serving, the default, e.g. \
                 --artifacts-destination)"
                ))
            })?;
        // `mlflow-artifacts://host:port/path` names the serving host; `mlflow-artifacts:/path`
        // is this server.
        let (base, path) = match rest.strip_prefix("//") {
            Some(hosted) => {
                let (authority, path) = hosted.split_once('/').unwrap_or((hosted, ""));
                let scheme = self.base.split("://").next().unwrap_or("http");
                (format!("{scheme}://{authority}"), path)
            }
            None => (self.base.clone(), rest.trim_start_matches('/')),
        };
        Ok(format!(
            "{base}/api/2.0/mlflow-artifacts/artifacts/{}/{name}",
            path.trim_end_matches('/')
        ))
    }

    /// Uploads `bytes` as artifact `name` of the run whose artifacts are at `artifact_uri`.
    pub fn upload_artifact(
        &self,
        artifact_uri: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<(), ApiError> {
        let url = self.artifact_url(artifact_uri, name)?;
        let request = self
            .authorized(self.agent.put(&url))
            .content_type("application/octet-stream");
        json_answer(&url, request.send(bytes)).map(drop)
    }

    /// Artifact `name` of the run whose artifacts are at `artifact_uri`; `None` when the run
    /// has no such artifact.
    pub fn download_artifact(
        &self,
        artifact_uri: &str,
        name: &str,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        let url = self.artifact_url(artifact_uri, name)?;
        let response = self
            .authorized(self.agent.get(&url))
            .call()
            .map_err(|e| unreachable(&e))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let bytes = body
            .with_config()
            .limit(MAX_DOWNLOAD_BYTES)
            .read_to_vec()
            .map_err(|e| unreachable(&e))?;
        match status {
            200..=299 => Ok(Some(bytes)),
            404 => Ok(None),
            _ => Err(refused(&url, status, &bytes)),
        }
    }
}

/// The JSON answer of a call to `endpoint`, or its error.
fn json_answer(
    endpoint: &str,
    result: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<Value, ApiError> {
    let response = result.map_err(|e| unreachable(&e))?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .read_to_vec()
        .map_err(|e| unreachable(&e))?;
    if !(200..300).contains(&status) {
        return Err(refused(endpoint, status, &bytes));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::BadAnswer(format!(
            "{endpoint}: the answer is not JSON ({e}); is this an MLflow server?"
        ))
    })
}

/// A transport error in words a user recognizes.
fn unreachable(error: &ureq::Error) -> ApiError {
    let reason = match error {
        ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused".to_owned()
        }
        ureq::Error::Timeout(_) => "no answer in time".to_owned(),
        ureq::Error::HostNotFound => "host not found".to_owned(),
        other => other.to_string(),
    };
    ApiError::Unreachable(reason)
}

/// An error answer: MLflow's `{"error_code", "message"}` when it sent one.
fn refused(endpoint: &str, status: u16, body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let code = parsed
        .as_ref()
        .and_then(|v| v["error_code"].as_str())
        .map(str::to_owned);
    let message = parsed
        .as_ref()
        .and_then(|v| v["message"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    ApiError::Refused {
        status,
        code,
        endpoint: endpoint.to_owned(),
        message,
    }
}

fn string_field(value: &Value, key: &str) -> Result<String, ApiError> {
    value[key]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| ApiError::BadAnswer(format!("the answer has no `{key}`: {value}")))
}

fn run_info(run: &Value) -> Result<RunInfo, ApiError> {
    let info = &run["info"];
    Ok(RunInfo {
        run_id: string_field(info, "run_id")?,
        experiment_id: string_field(info, "experiment_id")?,
        artifact_uri: string_field(info, "artifact_uri")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_urls() {
        let c = Client::new("http://127.0.0.1:5000");
        assert_eq!(
            c.artifact_url("mlflow-artifacts:/1/abc/artifacts", "run.json"),
            Ok(
                "http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/run.json"
                    .to_owned()
            )
        );
        assert_eq!(
            c.artifact_url("mlflow-artifacts://other:80/1/abc/artifacts/", "m"),
            Ok("http://other:80/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/m".to_owned())
        );
        let e = c.artifact_url("s3://bucket/1/abc", "m").unwrap_err();
        assert!(
            !e.is_transient() && e.to_string().contains("s3://bucket"),
            "{e}"
        );
    }
}
