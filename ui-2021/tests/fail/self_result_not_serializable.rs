#![allow(unused_variables)]
use idem::idempotent;

struct Account {
    id: String,
}

impl Account {
    #[idempotent(key = "id", mutating)]
    async fn open(id: String) -> Result<Self, String> {
        Ok(Account { id })
    }
}

fn main() {}
