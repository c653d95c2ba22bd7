use idem::idempotent;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Charge {
    run_id: String,
}

struct Server;

#[tool_router]
impl Server {
    #[tool]
    #[idempotent(key = "params.0.run_id", mutating)]
    async fn charge(&self, params: Parameters<Charge>) -> Result<String, String> {
        Ok(params.0.run_id)
    }
}

fn main() {}
