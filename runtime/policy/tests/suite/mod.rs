mod apparmor;
mod ceiling;
mod golden;
mod harden;
mod invalid;
mod landlock;
