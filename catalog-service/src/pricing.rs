//! The call to pricing-service (with `PRICING_URL`): a tonic client on a channel wrapped
//! in the crate's [`GrpcClientLayer`], so every call carries what is left of the
//! request's budget as `grpc-timeout` with nothing at the call site.
//!
//! The catalog retries a price once when the call cannot have done anything (a refused
//! connection, or `UNAVAILABLE`: `Price` is declared idempotent), unless the caller above
//! already owns retries for the request (orders-service sends `X-Previous-Attempts`):
//! one layer retries, so a failing pricing sees one call per attempt of the top hop.

use deadline_propagation::grpc::{self, GrpcClient, GrpcClientLayer};
use deadline_propagation::{Deadline, Downstream, Problem};
use pricing_service::proto::PriceRequest;
use pricing_service::proto::pricing_client::PricingClient;
use tonic::transport::{Channel, Endpoint};

/// The downstream's name: the stage of its time and of its 504s.
pub fn downstream() -> Downstream {
    Downstream::new("pricing").expect("a valid downstream name")
}

/// The method the catalog calls; it changes nothing, so it may run twice.
const PRICE: &str = "/pricing.v1.Pricing/Price";

/// A client of pricing-service; clones share the channel.
#[derive(Clone, Debug)]
pub struct Pricing {
    client: PricingClient<GrpcClient<Channel>>,
}

impl Pricing {
    /// A client of `url`, connecting on first use: the catalog starts (and stays ready)
    /// while pricing is down, and answers each call that needs it honestly instead.
    /// `every_hop` (PRICING_RETRY_EVERY_HOP) retries even under a caller that retries.
    pub fn new(url: &str, every_hop: bool) -> anyhow::Result<Self> {
        let channel = Endpoint::from_shared(url.to_owned())?.connect_lazy();
        let layer = GrpcClientLayer::new(downstream())
            .retry(true)
            .idempotent([PRICE])
            .retry_every_hop(every_hop);
        let channel = tower::ServiceBuilder::new().layer(layer).service(channel);
        Ok(Self {
            client: PricingClient::new(channel),
        })
    }

    /// The price of `sku` listed at `list_price_cents`, under the request's deadline.
    pub async fn price(
        &self,
        sku: &str,
        list_price_cents: u32,
        deadline: &Deadline,
    ) -> Result<u32, Problem> {
        let request = PriceRequest {
            sku: sku.to_owned(),
            list_price_cents,
        };
        match self.client.clone().price(request).await {
            Ok(reply) => Ok(reply.into_inner().price_cents),
            Err(status) => Err(grpc::problem(&status, downstream(), deadline)),
        }
    }
}
