pub mod react {}
