// A request type that is not `Clone` cannot go through a `PipelineLayer`:
// every attempt sends its own copy.
use std::convert::Infallible;

use seawall::tower::PipelineLayer;
use seawall::Pipeline;
use tower::{service_fn, Service, ServiceBuilder};

struct Upload(Vec<u8>);

// Stands for any stack that needs a `Service<Upload>` (a server, a client).
fn send_uploads<S: Service<Upload>>(_service: S) {}

fn main() {
    let layer = PipelineLayer::new(Pipeline::builder("uploads")).unwrap();
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: Upload| async { Ok::<_, Infallible>(()) }));
    send_uploads(service);
}
