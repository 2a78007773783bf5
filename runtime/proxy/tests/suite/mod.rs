mod harness;

mod clients;
mod dns;
mod guard;
mod http;
mod lifecycle;
mod load;
mod netns;
mod sni;
mod socks;
mod tls_inject;
