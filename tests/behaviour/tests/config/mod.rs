//! Policies and budgets from configuration files.

mod files;
