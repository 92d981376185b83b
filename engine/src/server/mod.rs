//! The agents' door: an OpenAI-compatible HTTP API on the shared engine.
//!
//! `POST /v1/chat/completions` (streamed as server-sent events or whole), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text). A request may carry `priority` (lower is
//! more urgent, as in vLLM); without one it runs at [`AGENT_PRIORITY`](crate::AGENT_PRIORITY).
//! Every refusal is an OpenAI-style JSON error and touches nothing else in flight.

mod metrics;
pub mod openai;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::{Engine, StreamEvent};
pub use metrics::Metrics;
use openai::{ApiError, ChatCompletionBody, Limits};

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    pub limits: Limits,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: 4 << 20,
            limits: Limits {
                max_tokens: 2048,
                default_max_tokens: 256,
            },
        }
    }
}

struct AppState {
    engine: Arc<Engine>,
    config: ServerConfig,
    metrics: Arc<Metrics>,
}

/// The HTTP routes, ready to serve with `axum::serve`.
pub fn router(engine: Arc<Engine>, config: ServerConfig, metrics: Arc<Metrics>) -> Router {
    let limit = config.max_body_bytes;
    let state = Arc::new(AppState {
        engine,
        config,
        metrics,
    });
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics_text))
        .fallback(|| async {
            error_response(&ApiError {
                status: 404,
                kind: "not_found_error",
                param: None,
                message: "no such route".into(),
            })
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, Json(error.body())).into_response()
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.config.api_key else {
        return Ok(());
    };
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError {
            status: 401,
            kind: "authentication_error",
            param: None,
            message: "missing or wrong API key (send Authorization: Bearer <key>)".into(),
        })
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&state, &headers) {
        return error_response(&e);
    }
    Json(json!({"object": "list", "data": [{
        "id": state.engine.model_name(), "object": "model", "created": 0, "owned_by": "sublet",
    }]}))
    .into_response()
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render() + &metrics::render_scheduler(&state.engine.scheduler_state()),
    )
        .into_response()
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match serve_chat(&state, &headers, body).await {
        Ok(response) => response,
        Err(error) => {
            state.metrics.refused(error.status);
            error_response(&error)
        }
    }
}

async fn serve_chat(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(state, headers)?;
    let body = body.map_err(|e| ApiError {
        status: e.status().as_u16(),
        kind: "invalid_request_error",
        param: None,
        message: format!("cannot read the request body: {}", e.body_text()),
    })?;
    let parsed: ChatCompletionBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(None, format!("malformed JSON body: {e}")))?;
    let stream_requested = parsed.stream;
    let (request, include_usage) = parsed.into_request(&state.config.limits)?;
    let priority = request.priority;
    let mut reply = state
        .engine
        .chat_async(request)
        .await
        .map_err(|e| ApiError {
            status: 503,
            kind: "server_error",
            param: None,
            message: e.to_string(),
        })?;
    // The first event tells a refused request (e.g. a prompt over the model's length) from
    // one that runs, before any status is sent.
    let first = match reply.next().await {
        Some(Ok(event)) => event,
        Some(Err(e)) if e.invalid_request => {
            return Err(ApiError::invalid(Some("messages"), e.message))
        }
        Some(Err(e)) => return Err(ApiError::server(e.message)),
        None => return Err(ApiError::server("the engine ended the request")),
    };
    let id = format!("chatcmpl-{}", state.metrics.started(priority));
    let model = state.engine.model_name().to_string();
    let created = now_s();

    if !stream_requested {
        let mut text = String::new();
        let mut event: Option<Result<StreamEvent, crate::EngineError>> = Some(Ok(first));
        loop {
            match event {
                Some(Ok(StreamEvent::Text(t))) => text.push_str(&t),
                Some(Ok(StreamEvent::Done(finish))) => {
                    state.metrics.finished(
                        priority,
                        finish.prompt_tokens,
                        finish.completion_tokens,
                    );
                    return Ok(Json(json!({
                        "id": id, "object": "chat.completion", "created": created, "model": model,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish.reason}],
                        "usage": openai::usage(finish.prompt_tokens, finish.completion_tokens),
                    }))
                    .into_response());
                }
                Some(Err(e)) => {
                    state.metrics.failed(priority);
                    return Err(ApiError::server(e.message));
                }
                None => {
                    state.metrics.failed(priority);
                    return Err(ApiError::server("reply ended early"));
                }
            }
            event = reply.next().await;
        }
    }

    // Streamed: one event per piece of text, the finish, optionally usage, then [DONE].
    // The client going away drops this stream, and with it the request in the engine.
    let metrics = state.metrics.clone();
    let mut pending = Some(first);
    let mut role_sent = false;
    let mut done = false;
    let events = futures::stream::poll_fn(
        move |cx| -> std::task::Poll<Option<Result<Event, Infallible>>> {
            use std::task::Poll;
            if done {
                return Poll::Ready(None);
            }
            let event = match pending.take() {
                Some(e) => e,
                None => match reply.poll_next(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(e))) => e,
                    Poll::Ready(Some(Err(e))) => {
                        metrics.failed(priority);
                        done = true;
                        let body = ApiError::server(e.message).body();
                        return Poll::Ready(Some(Ok(Event::default().data(body.to_string()))));
                    }
                    Poll::Ready(None) => {
                        done = true;
                        return Poll::Ready(Some(Ok(Event::default().data("[DONE]"))));
                    }
                },
            };
            let data = match event {
                StreamEvent::Text(text) => {
                    let delta = if role_sent {
                        json!({"content": text})
                    } else {
                        role_sent = true;
                        json!({"role": "assistant", "content": text})
                    };
                    openai::chunk(&id, created, &model, delta, None).to_string()
                }
                StreamEvent::Done(finish) => {
                    metrics.finished(priority, finish.prompt_tokens, finish.completion_tokens);
                    let mut last =
                        openai::chunk(&id, created, &model, json!({}), Some(&finish.reason));
                    if include_usage {
                        last["usage"] =
                            openai::usage(finish.prompt_tokens, finish.completion_tokens);
                    }
                    last.to_string()
                }
            };
            Poll::Ready(Some(Ok(Event::default().data(data))))
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
