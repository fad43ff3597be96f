//! Logs and traces of the toolgraph binary.
//!
//! Logs go to stderr through `tracing` (filter: `TOOLGRAPH_LOG`, else the verbosity), as text
//! or as one JSON object per line. Spans of the toolgraph crates (`http.request`, `chat.turn`,
//! `llm.call`, `tool.call`) are exported in batches, off the request path, when the standard
//! OpenTelemetry variables name a collector (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; OTLP over HTTP with protobuf in every build, over gRPC
//! with the `otlp` feature), or the way the Lumie worker configures it (`OTEL_ENDPOINT`,
//! `OTEL_ENABLED` not false; gRPC). Without an endpoint nothing is exported and no exporter is
//! built. docs/deploy.md ("Logs, traces and metrics") lists the variables.

use std::time::Duration;

/// A telemetry set-up failure.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A setting is invalid; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The exporter could not be built.
    #[error("cannot start the OTLP exporter: {0}")]
    Exporter(String),
    /// A global subscriber was already installed.
    #[error("logging was already set up")]
    AlreadyInstalled,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, port 4318): every build.
    HttpProtobuf,
    /// OTLP/gRPC (port 4317): builds with the `otlp` feature (`--features otel`).
    Grpc,
}

/// Where spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpOptions {
    /// The URL spans are sent to: for HTTP the full `/v1/traces` URL, for gRPC the collector.
    pub endpoint: String,
    /// How.
    pub protocol: OtlpProtocol,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Limit of one export call.
    pub timeout: Duration,
}

impl OtlpOptions {
    /// The export the environment asks for, or `None`.
    ///
    /// The standard variables: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the URL as is) or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL; `/v1/traces` is added for HTTP),
    /// `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` (`http/protobuf`, the default, or `grpc`),
    /// `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (milliseconds, default 10000), `OTEL_SERVICE_NAME`
    /// (default `toolgraph`), `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` (no
    /// export; a list naming `otlp` exports); `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` and `OTEL_RESOURCE_ATTRIBUTES` are read
    /// by the exporter. The Lumie worker's: `OTEL_ENDPOINT` (gRPC) and `OTEL_ENABLED`.
    ///
    /// # Errors
    /// An endpoint that is not an http(s) URL, a boolean that is not one, an unknown protocol
    /// or exporter, or a timeout that is not a number of milliseconds.
    pub fn from_env() -> Result<Option<Self>, TelemetryError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any variable source (tests).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TelemetryError> {
        let set = |name: &str| var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        // As the specification reads it: only `true` (any case) disables; anything else does not.
        let sdk_disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if !boolean(set("OTEL_ENABLED"), "OTEL_ENABLED", true)? || sdk_disabled {
            return Ok(None);
        }
        // A list (`otlp,console`): spans go over OTLP when it names `otlp`; none when it says `none`.
        if let Some(exporters) = set("OTEL_TRACES_EXPORTER") {
            let named: Vec<String> = exporters.split(',').map(|e| e.trim().to_ascii_lowercase()).collect();
            if named.iter().all(|e| e == "none") {
                return Ok(None);
            }
            if !named.iter().any(|e| e == "otlp") {
                return Err(TelemetryError::Invalid(format!(
                    "OTEL_TRACES_EXPORTER: '{exporters}' names no exporter this binary has (otlp or none)"
                )));
            }
        }
        let service_name = set("OTEL_SERVICE_NAME").unwrap_or_else(|| "toolgraph".into());
        let timeout = match set("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", v))
            .or_else(|| set("OTEL_EXPORTER_OTLP_TIMEOUT").map(|v| ("OTEL_EXPORTER_OTLP_TIMEOUT", v)))
        {
            None => Duration::from_secs(10),
            Some((name, v)) => Duration::from_millis(v.parse::<u64>().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                TelemetryError::Invalid(format!("{name}: '{v}' is not a number of milliseconds such as 10000"))
            })?),
        };
        // The Lumie worker's gRPC endpoint, unless this build cannot speak gRPC and the standard
        // variables name a collector it can reach.
        let standard =
            set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        if let Some(endpoint) = set("OTEL_ENDPOINT").filter(|_| cfg!(feature = "otlp") || !standard) {
            let endpoint = http_url("OTEL_ENDPOINT", endpoint, "http://otel-collector:4317")?;
            return Ok(Some(Self { endpoint, protocol: OtlpProtocol::Grpc, service_name, timeout }));
        }
        let protocol_var = ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
            .into_iter()
            .find_map(|name| set(name).map(|v| (name, v)));
        let protocol = match protocol_var {
            None => OtlpProtocol::HttpProtobuf,
            Some((_, v)) if v == "http/protobuf" => OtlpProtocol::HttpProtobuf,
            Some((_, v)) if v == "grpc" => OtlpProtocol::Grpc,
            Some((name, v)) => {
                return Err(TelemetryError::Invalid(format!(
                    "{name}: '{v}' is not supported (http/protobuf, the default, or grpc)"
                )));
            }
        };
        let endpoint = if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            http_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url, "http://otel-collector:4318/v1/traces")?
        } else if let Some(base) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
            let base = http_url("OTEL_EXPORTER_OTLP_ENDPOINT", base, "http://otel-collector:4318")?;
            match protocol {
                OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
                OtlpProtocol::Grpc => base,
            }
        } else {
            return Ok(None);
        };
        Ok(Some(Self { endpoint, protocol, service_name, timeout }))
    }
}

/// A boolean variable: `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off`, any case.
fn boolean(value: Option<String>, name: &str, unset: bool) -> Result<bool, TelemetryError> {
    let Some(v) = value else { return Ok(unset) };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        other => Err(TelemetryError::Invalid(format!("{name}: '{other}' is not true or false"))),
    }
}

/// `url` when it is an http(s) URL with a host, else the error naming `name` and an example.
fn http_url(name: &str, url: String, example: &str) -> Result<String, TelemetryError> {
    let host = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    if host.is_none_or(|h| h.is_empty() || h.starts_with('/')) {
        return Err(TelemetryError::Invalid(format!("{name}: '{url}' is not an http(s) URL such as {example}")));
    }
    Ok(url)
}

/// What to set up.
#[derive(Debug, Clone)]
pub struct TelemetryOptions {
    /// `tracing` filter of the stderr log (`EnvFilter` syntax).
    pub log_filter: String,
    /// Colour codes in the log (for a person at a terminal; never in JSON).
    pub ansi: bool,
    /// Lines for people, or one JSON object per line for a log collector.
    pub format: LogFormat,
    /// Span export; `None`: none.
    pub otlp: Option<OtlpOptions>,
}

/// How the stderr log is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Lines for people: time, level, target, message and fields.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, and the current
    /// span and its parents under `span` and `spans`), as log collectors read it.
    Json,
}

/// The crates whose spans are exported.
pub const TRACED_CRATES: [&str; 6] =
    ["toolgraph", "toolgraph_server", "toolgraph_graph", "toolgraph_llm", "toolgraph_tools", "toolgraph_rag"];

/// Keeps the exporter alive; [`shutdown`](Self::shutdown) flushes the spans still queued.
#[must_use = "dropping the guard without shutdown loses the spans still queued"]
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is queued and stops the exporter. Blocks (up to the export timeout):
    /// call it outside async code, or on a blocking thread.
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("warning: the OTLP exporter did not shut down cleanly: {e}");
        }
    }
}

/// Installs the global subscriber: the stderr log, plus the OTLP layer when `options.otlp`
/// is set (over gRPC only in a build with the `otlp` feature; without it a warning says the
/// endpoint is ignored). With OTLP, call this inside the Tokio runtime: the batch exporter
/// runs on it.
///
/// # Errors
/// See [`TelemetryError`].
pub fn install(options: TelemetryOptions) -> Result<TelemetryGuard, TelemetryError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let filter = EnvFilter::try_new(&options.log_filter)
        .map_err(|e| TelemetryError::Invalid(format!("log filter '{}': {e}", options.log_filter)))?;
    let log = match options.format {
        LogFormat::Text => {
            tracing_subscriber::fmt::layer().with_ansi(options.ansi).with_writer(std::io::stderr).boxed()
        }
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter);
    let registry = tracing_subscriber::registry().with(log);
    let unbuilt = options.otlp.as_ref().filter(|o| o.protocol == OtlpProtocol::Grpc && !cfg!(feature = "otlp"));
    let (layer, provider) = match options.otlp.as_ref().filter(|_| unbuilt.is_none()) {
        Some(o) => {
            let (layer, provider) = otlp::layer(o)?;
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    registry.with(layer).try_init().map_err(|_| TelemetryError::AlreadyInstalled)?;
    if let Some(o) = unbuilt {
        tracing::warn!(
            endpoint = %o.endpoint,
            "OTLP over gRPC needs a build with `--features otel`; spans are not exported. \
             OTLP over HTTP works in every build: OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318"
        );
    }
    Ok(TelemetryGuard { provider })
}

mod otlp {
    //! The OTLP span exporter (HTTP, or gRPC with the `otlp` feature) as a `tracing` layer.

    use super::{OtlpOptions, OtlpProtocol, TRACED_CRATES, TelemetryError};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
    use std::sync::Arc;
    use std::time::Duration;
    use tracing::Level;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::registry::LookupSpan;

    /// The layer exporting the toolgraph crates' spans, and the provider to shut down.
    pub fn layer<S>(o: &OtlpOptions) -> Result<(impl Layer<S>, SdkTracerProvider), TelemetryError>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let failed = |e: &dyn std::fmt::Display| TelemetryError::Exporter(e.to_string());
        let exporter = match o.protocol {
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(http_client(o.timeout).map_err(|e| failed(&e))?)
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .build()
                .map_err(|e| failed(&e))?,
            #[cfg(feature = "otlp")]
            OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(o.endpoint.clone())
                .with_timeout(o.timeout)
                .build()
                .map_err(|e| failed(&e))?,
            #[cfg(not(feature = "otlp"))]
            OtlpProtocol::Grpc => {
                return Err(TelemetryError::Invalid("OTLP over gRPC needs a build with `--features otel`".into()));
            }
        };
        // The batch processor runs on the Tokio runtime: the SDK's default one exports from
        // a thread of its own, where neither tonic nor reqwest finds a reactor.
        let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(Resource::builder().with_service_name(o.service_name.clone()).build())
            .build();
        let tracer = provider.tracer("toolgraph");
        let targets = TRACED_CRATES.iter().fold(Targets::new(), |t, c| t.with_target(*c, Level::INFO));
        let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(targets);
        Ok((layer, provider))
    }

    /// The exporter's HTTP client: reqwest on rustls with ring and the webpki roots (the one
    /// TLS stack of the binary), bounded in time.
    fn http_client(limit: Duration) -> Result<reqwest013::Client, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        reqwest013::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(limit)
            .connect_timeout(limit.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn the_seed_settings_decide_whether_spans_are_exported() {
        assert_eq!(OtlpOptions::from_vars(vars(&[])).unwrap(), None, "no endpoint, no export");
        assert_eq!(OtlpOptions::from_vars(vars(&[("OTEL_ENDPOINT", " ")])).unwrap(), None);
        let on = OtlpOptions::from_vars(vars(&[("OTEL_ENDPOINT", "http://collector:4317")])).unwrap().unwrap();
        assert_eq!((on.endpoint.as_str(), on.service_name.as_str()), ("http://collector:4317", "toolgraph"));
        let off = vars(&[("OTEL_ENDPOINT", "http://collector:4317"), ("OTEL_ENABLED", "false")]);
        assert_eq!(OtlpOptions::from_vars(off).unwrap(), None, "OTEL_ENABLED=false wins");
        let named = vars(&[("OTEL_ENDPOINT", "https://c:4317"), ("OTEL_ENABLED", "1"), ("OTEL_SERVICE_NAME", "tg")]);
        assert_eq!(OtlpOptions::from_vars(named).unwrap().unwrap().service_name, "tg");
    }

    #[test]
    fn the_standard_variables_decide_where_spans_go() {
        let base = vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]);
        let o = OtlpOptions::from_vars(base).unwrap().unwrap();
        assert_eq!(o.endpoint, "http://collector:4318/v1/traces", "a base URL gets the signal's path");
        assert_eq!((o.protocol, o.timeout), (OtlpProtocol::HttpProtobuf, Duration::from_secs(10)));
        let exact = vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://c.example/otlp/traces"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_SERVICE_NAME", "tutor"),
        ]);
        let o = OtlpOptions::from_vars(exact).unwrap().unwrap();
        assert_eq!(o.endpoint, "https://c.example/otlp/traces", "the signal's own URL is taken as it is");
        assert_eq!((o.timeout, o.service_name.as_str()), (Duration::from_millis(2500), "tutor"));
        let grpc = vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        let o = OtlpOptions::from_vars(grpc).unwrap().unwrap();
        assert_eq!((o.endpoint.as_str(), o.protocol), ("http://c:4317", OtlpProtocol::Grpc));
        for off in [("OTEL_SDK_DISABLED", "TRUE"), ("OTEL_TRACES_EXPORTER", "none"), ("OTEL_ENABLED", "off")] {
            let pairs = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off];
            assert_eq!(OtlpOptions::from_vars(vars(&pairs)).unwrap(), None, "{off:?} turns export off");
        }
        for on in [("OTEL_SDK_DISABLED", "1"), ("OTEL_TRACES_EXPORTER", "otlp,console")] {
            let pairs = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), on];
            assert!(OtlpOptions::from_vars(vars(&pairs)).unwrap().is_some(), "{on:?} leaves export on");
        }
        let seed = vars(&[("OTEL_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://d:4318")]);
        let chosen = OtlpOptions::from_vars(seed).unwrap().unwrap().protocol;
        // The Lumie setting wins where this build speaks gRPC; elsewhere the collector it can reach.
        let expected = if cfg!(feature = "otlp") { OtlpProtocol::Grpc } else { OtlpProtocol::HttpProtobuf };
        assert_eq!(chosen, expected);
        let only_seed = vars(&[("OTEL_ENDPOINT", "http://c:4317"), ("OTEL_TRACES_EXPORTER", "none")]);
        assert_eq!(OtlpOptions::from_vars(only_seed).unwrap(), None, "none wins over the Lumie setting");
    }

    #[test]
    fn bad_settings_are_named() {
        let err = OtlpOptions::from_vars(vars(&[("OTEL_ENDPOINT", "collector:4317")])).unwrap_err().to_string();
        assert!(err.contains("OTEL_ENDPOINT") && err.contains("collector:4317"), "{err}");
        let err = OtlpOptions::from_vars(vars(&[("OTEL_ENABLED", "maybe")])).unwrap_err().to_string();
        assert!(err.contains("OTEL_ENABLED") && err.contains("maybe"), "{err}");
        let with = |pairs: &[(&str, &str)]| {
            let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
            all.extend_from_slice(pairs);
            OtlpOptions::from_vars(vars(&all)).unwrap_err().to_string()
        };
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "udp"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://"),
        ] {
            let err = with(&[(name, value)]);
            assert!(err.contains(name) && err.contains(value), "{name}={value}: {err}");
        }
        let err =
            install(TelemetryOptions { log_filter: "=[".into(), ansi: false, format: LogFormat::Text, otlp: None })
                .err()
                .unwrap();
        assert!(err.to_string().contains("log filter"), "{err}");
    }
}
