use idem::{Idem, Outcome, idempotent};

struct Crm {
    account: String,
}

impl Crm {
    /// Docs and other attributes are kept.
    #[idempotent(key = "self.account, ticket_ref", mutating, name = "crm.ticket")]
    #[allow(clippy::unused_async)]
    pub async fn create_ticket(&self, ticket_ref: String) -> Result<String, String> {
        Ok(format!("{}-{ticket_ref}", self.account))
    }

    #[idempotent(key = "ticket_ref", mutating, name = "crm.close")]
    async fn close(&mut self, ticket_ref: String) -> Result<(), String> {
        self.account.push('!');
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let idem = Idem::open("memory://").await.unwrap();
    let mut crm = Crm { account: "a".into() };
    let out = idem.scope("t").run(crm.create_ticket("t-1".into())).await.unwrap();
    assert_eq!(out, Outcome::Fresh("a-t-1".to_owned()));
    assert!(idem.scope("t").run(crm.close("t-1".into())).await.unwrap().is_fresh());
}
