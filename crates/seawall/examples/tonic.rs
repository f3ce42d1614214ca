//! A tonic gRPC client behind a pipeline: `UNAVAILABLE` is retried,
//! `RESOURCE_EXHAUSTED` is throttling (retried after the server's
//! `grpc-retry-pushback-ms`, not a failure of the server), a request the
//! server calls wrong is not retried, and every attempt's `grpc-timeout` is
//! the time left before the call's deadline.
//!
//! The example starts a greeter on 127.0.0.1 (a free port) that answers
//! from a script, makes four calls through the pipeline, prints what each
//! got, the `grpc-timeout` the server saw on each attempt and the wait
//! before each retry, and exits. No `protoc`: the messages are written by
//! hand with prost's derive, and the client and the server use tonic's
//! generic codec API, as generated code would.
//!
//! ```text
//! cargo run -p seawall --example tonic --features tonic
//! ```

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use seawall::event::EventKind;
use seawall::pipeline::ErrorType;
use seawall::{Pipeline, PipelineBuilder, Retry};
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;

/// `seawall.example.Greeter/SayHello`'s request.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HelloRequest {
    /// Who to greet.
    #[prost(string, tag = "1")]
    pub(crate) name: String,
}

/// `seawall.example.Greeter/SayHello`'s reply.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HelloReply {
    /// The greeting.
    #[prost(string, tag = "1")]
    pub(crate) message: String,
}

const SERVICE: &str = "seawall.example.Greeter";
const SAY_HELLO: &str = "/seawall.example.Greeter/SayHello";

/// The policies of every call: 3 s for the whole call, retries included,
/// and 3 attempts 20 ms apart (or after the server's pushback, when longer);
/// each status judged by `seawall::tonic::classify`.
pub(crate) fn greeter_pipeline() -> PipelineBuilder<ErrorType<Status>> {
    Pipeline::builder("greeter")
        .timeout(Duration::from_secs(3))
        .retry(Retry::constant(Duration::from_millis(20)).max_attempts(3))
        .classify(seawall::tonic::classify)
}

/// One answer of the scripted server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A greeting.
    Hello,
    /// This code, with this `grpc-retry-pushback-ms` trailer if any.
    Fail(Code, Option<&'static str>),
}

/// The greeter: answers each call with the next answer of its script
/// (`Hello` once the script is done), and notes the `grpc-timeout` header
/// of every request it gets.
#[derive(Debug, Clone, Default)]
pub(crate) struct Greeter {
    script: Arc<Mutex<VecDeque<Answer>>>,
    /// The `grpc-timeout` of each request, as sent (`None`: no header).
    pub(crate) timeouts: Arc<Mutex<Vec<Option<String>>>>,
}

impl Greeter {
    /// A greeter that answers `script`, then `Hello`.
    pub(crate) fn new(script: impl IntoIterator<Item = Answer>) -> Self {
        Greeter {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            timeouts: Arc::default(),
        }
    }

    /// Serves on a free port of 127.0.0.1 until the task is aborted.
    pub(crate) async fn serve(&self) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = Server::builder().add_service(self.clone());
        let task = tokio::spawn(async move {
            // The server runs until the example (or test) aborts it.
            let _ = server
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        Ok((addr, task))
    }

    fn answer(&self, request: &HelloRequest) -> Result<Response<HelloReply>, Status> {
        let next = self.script.lock().unwrap().pop_front();
        match next.unwrap_or(Answer::Hello) {
            Answer::Hello => Ok(Response::new(HelloReply {
                message: format!("hello, {}", request.name),
            })),
            Answer::Fail(code, pushback) => {
                let mut trailers = MetadataMap::new();
                if let Some(ms) = pushback {
                    trailers.insert(seawall::tonic::RETRY_PUSHBACK, ms.parse().unwrap());
                }
                Err(Status::with_metadata(code, "scripted", trailers))
            }
        }
    }
}

impl NamedService for Greeter {
    const NAME: &'static str = SERVICE;
}

/// `SayHello` as tonic's server runs a unary method.
struct SayHello(Greeter);

impl UnaryService<HelloRequest> for SayHello {
    type Response = HelloReply;
    type Future = Pin<Box<dyn Future<Output = Result<Response<HelloReply>, Status>> + Send>>;

    fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
        let answer = self.0.answer(request.get_ref());
        Box::pin(async move { answer })
    }
}

impl tower::Service<http::Request<Body>> for Greeter {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let timeout = request
            .headers()
            .get(seawall::tonic::GRPC_TIMEOUT)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        self.timeouts.lock().unwrap().push(timeout);
        let greeter = self.clone();
        Box::pin(async move {
            if request.uri().path() != SAY_HELLO {
                return Ok(Status::unimplemented(request.uri().path().to_owned()).into_http());
            }
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
            Ok(grpc.unary(SayHello(greeter), request).await)
        })
    }
}

/// A client of the greeter, as generated code would be.
#[derive(Debug, Clone)]
pub(crate) struct GreeterClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl GreeterClient {
    /// Connects to the greeter at `addr`.
    pub(crate) async fn connect(addr: SocketAddr) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        Ok(GreeterClient {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// `SayHello`.
    pub(crate) async fn say_hello(
        &mut self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("greeter not ready: {e}")))?;
        let path = http::uri::PathAndQuery::from_static(SAY_HELLO);
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        self.grpc.unary(request, path, codec).await
    }
}

/// What one call got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The greeting, or how the call failed.
    pub(crate) result: Result<String, String>,
    /// The `grpc-timeout` the server saw on each attempt.
    pub(crate) timeouts: Vec<Option<String>>,
    /// The wait before each retry.
    pub(crate) waits: Vec<Duration>,
}

/// The four calls of the example: the script of the server, one call per
/// line. Each call gets the answers of its line, then a greeting.
pub(crate) fn script() -> Vec<Answer> {
    vec![
        // Call 1: the server restarts; the retry gets the greeting.
        Answer::Fail(Code::Unavailable, None),
        Answer::Hello,
        // Call 2: the server is busy and asks for 150 ms; the retry waits that long.
        Answer::Fail(Code::ResourceExhausted, Some("150")),
        Answer::Hello,
        // Call 3: the request is wrong; no retry.
        Answer::Fail(Code::InvalidArgument, None),
        // Call 4: the server is down and says not to retry.
        Answer::Fail(Code::Unavailable, Some("-1")),
    ]
}

/// The whole run: the scripted greeter, four calls through `pipeline`.
pub(crate) async fn run(
    pipeline: PipelineBuilder<ErrorType<Status>>,
) -> Result<Vec<Outcome>, Box<dyn std::error::Error>> {
    let greeter = Greeter::new(script());
    let (addr, server) = greeter.serve().await?;
    let client = GreeterClient::connect(addr).await?;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let noted = Arc::clone(&waits);
    let pipeline = pipeline
        .on_event(move |event| {
            if let EventKind::RetryScheduled { delay, .. } = event.kind {
                noted.lock().unwrap().push(delay);
            }
        })
        .build()?;

    let mut outcomes = Vec::new();
    for name in ["ada", "grace", "linus", "barbara"] {
        let before = greeter.timeouts.lock().unwrap().len();
        let result = pipeline
            .run(|ctx| {
                let mut client = client.clone();
                let hello = HelloRequest { name: name.into() };
                async move {
                    // The time left before the call's deadline, as grpc-timeout.
                    let request = seawall::tonic::with_deadline(Request::new(hello), &ctx);
                    client.say_hello(request).await
                }
            })
            .await;
        outcomes.push(Outcome {
            result: result.map(|reply| reply.into_inner().message).map_err(|e| {
                match e.operation_error() {
                    Some(status) => format!("{:?}: {}", status.code(), status.message()),
                    None => e.to_string(),
                }
            }),
            timeouts: greeter.timeouts.lock().unwrap()[before..].to_vec(),
            waits: std::mem::take(&mut *waits.lock().unwrap()),
        });
    }
    server.abort();
    Ok(outcomes)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (n, outcome) in run(greeter_pipeline()).await?.iter().enumerate() {
        let result = match &outcome.result {
            Ok(greeting) => format!("{greeting:?}"),
            Err(failure) => format!("failed, {failure}"),
        };
        println!(
            "call {}: {result} after {} attempt(s); grpc-timeout {:?}; waited {:?}",
            n + 1,
            outcome.timeouts.len(),
            outcome.timeouts,
            outcome.waits,
        );
    }
    Ok(())
}
