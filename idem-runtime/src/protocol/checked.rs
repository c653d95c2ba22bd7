//! A tool's value on its way through the call protocol: stored as [`Checked`] (the value, as
//! `Serialize` and `Deserialize` as `Replayable` makes it). The entry points the generated code
//! calls bound the value by [`Replayable`] alone, the bound the attribute puts on the tool, so
//! that a value that cannot be stored is one error; the protocol, written for serde types,
//! stores `Checked<V>`.

#[cfg(feature = "postgres")]
use serde::{Serialize, Serializer};

use super::call::Check;
use crate::value::{Checked, Replayable};

/// A value of a tool, lent to be stored as the value itself would be (a transactional tool's
/// value, encoded inside its transaction).
#[cfg(feature = "postgres")]
pub(crate) struct CheckedRef<'a, V>(pub(crate) &'a V);

#[cfg(feature = "postgres")]
impl<V: Replayable> Serialize for CheckedRef<'_, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_replayable(serializer)
    }
}

/// A tool's state check, answering its value as [`Checked`].
pub(crate) struct CheckedAnswer<C>(pub(crate) C);

impl<A, E, V, C> Check<A, Checked<V>, E> for CheckedAnswer<C>
where
    V: Replayable,
    C: Check<A, V, E>,
{
    const RECONCILES: bool = C::RECONCILES;

    async fn check(self, args: &A) -> Result<Option<Checked<V>>, E> {
        self.0.check(args).await.map(|found| found.map(Checked))
    }
}
