// A request type that is not `Clone` cannot go through a `PipelineLayer`:
// every attempt sends its own copy.
use std::convert::Infallible;

use seawall::tower::PipelineLayer;
use seawall::Pipeline;
use tower::{service_fn, Layer, Service};

struct Upload(Vec<u8>);

fn main() {
    let layer = PipelineLayer::new(Pipeline::builder("uploads")).unwrap();
    let mut service = layer.layer(service_fn(|_: Upload| async { Ok::<_, Infallible>(()) }));
    let _ = service.call(Upload(vec![1, 2, 3]));
}
