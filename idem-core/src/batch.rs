//! What a batch tool returns: one answer per item, in the items' order.

use crate::error::Error;
use crate::outcome::Outcome;

/// The answers of a batch tool's call (`key = "…, items[].id"`): one per item, in the order
/// the items were given. Each is what a call of that item alone would answer: `Fresh` for the
/// items the body ran, `Replayed` for those done before, `Mismatch`, `InFlight` or `Unknown`
/// for those it did not run, or an error of that item alone (its own key was invalid, it
/// repeated an earlier item's key, the tool failed on it).
///
/// ```
/// use idem_core::{Batch, Outcome};
///
/// let batch: Batch<u32, String> = Batch::new(vec![
///     Ok(Outcome::Fresh(1)),
///     Ok(Outcome::Replayed(2)),
///     Err(idem_core::Error::Tool {
///         error: "declined".to_owned(),
///         replayed: false,
///         class: idem_core::ErrorClass::Store,
///     }),
/// ]);
/// assert_eq!(batch.len(), 3);
/// assert_eq!(batch.ran(), 2, "the body ran on the first and the third item");
/// assert_eq!(batch.values().collect::<Vec<_>>(), [Some(&1), Some(&2), None]);
/// ```
#[derive(Debug)]
pub struct Batch<T, E> {
    items: Vec<Result<Outcome<T>, Error<E>>>,
}

impl<T, E> Batch<T, E> {
    /// The answers, in the items' order.
    pub fn new(items: Vec<Result<Outcome<T>, Error<E>>>) -> Self {
        Batch { items }
    }

    /// How many items the batch had.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the batch had no item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The answer of item `index`.
    pub fn get(&self, index: usize) -> Option<&Result<Outcome<T>, Error<E>>> {
        self.items.get(index)
    }

    /// The answers, in the items' order.
    pub fn iter(&self) -> std::slice::Iter<'_, Result<Outcome<T>, Error<E>>> {
        self.items.iter()
    }

    /// The value of each item (fresh or replayed), `None` for an item without one.
    pub fn values(&self) -> impl Iterator<Item = Option<&T>> {
        self.items
            .iter()
            .map(|item| item.as_ref().ok().and_then(Outcome::value))
    }

    /// How many items the body ran on during this call (their effect happened now).
    pub fn ran(&self) -> usize {
        self.items
            .iter()
            .filter(|item| match item {
                Ok(outcome) => outcome.is_fresh(),
                Err(error) => error.body_ran(),
            })
            .count()
    }

    /// The answers, in the items' order.
    pub fn into_vec(self) -> Vec<Result<Outcome<T>, Error<E>>> {
        self.items
    }
}

impl<T, E> IntoIterator for Batch<T, E> {
    type Item = Result<Outcome<T>, Error<E>>;
    type IntoIter = std::vec::IntoIter<Self::Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, T, E> IntoIterator for &'a Batch<T, E> {
    type Item = &'a Result<Outcome<T>, Error<E>>;
    type IntoIter = std::slice::Iter<'a, Result<Outcome<T>, Error<E>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
