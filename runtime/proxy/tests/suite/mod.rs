mod harness;

mod clients;
mod guard;
mod http;
mod lifecycle;
mod load;
mod netns;
mod socks;
