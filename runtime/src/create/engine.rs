//! Where the runtime meets libcontainer: the container operations `create` and `delete` use,
//! behind a trait so that their order and clean-up are unit-tested with a recording fake (the
//! shape of youki's `Syscall` trait and its test double). [`Libcontainer`] is the real one.

use std::path::PathBuf;

use libcontainer::container::Container;
use libcontainer::container::init_builder::InitContainerBuilder;
use libcontainer::error::LibcontainerError;

/// The container engine under the runtime.
pub trait Engine: Send + Sync {
    /// Creates the init from a configured builder; it then waits for `start`.
    fn build_init(&self, init: InitContainerBuilder) -> Result<Container, LibcontainerError>;
    /// The container saved in `dir` (libcontainer's `state.json`), status as saved.
    fn load(&self, dir: PathBuf) -> Result<Container, LibcontainerError>;
    /// Brings `c`'s status up to date with its init process.
    fn refresh(&self, c: &mut Container) -> Result<(), LibcontainerError>;
    /// Removes the container (with `force`, kills it first).
    fn delete(&self, c: &mut Container, force: bool) -> Result<(), LibcontainerError>;
}

/// youki's libcontainer.
#[derive(Debug, Default, Clone, Copy)]
pub struct Libcontainer;

impl Engine for Libcontainer {
    fn build_init(&self, init: InitContainerBuilder) -> Result<Container, LibcontainerError> {
        init.build()
    }

    fn load(&self, dir: PathBuf) -> Result<Container, LibcontainerError> {
        Container::load(dir)
    }

    fn refresh(&self, c: &mut Container) -> Result<(), LibcontainerError> {
        c.refresh_status()
    }

    fn delete(&self, c: &mut Container, force: bool) -> Result<(), LibcontainerError> {
        c.delete(force)
    }
}

/// A recording engine for unit tests: every call is logged in order, containers come from a
/// table, `build_init` fails unless a test gave it the container to make, and `delete` fails
/// as often as a test says.
#[cfg(test)]
pub mod fake {
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::Mutex;

    use libcontainer::container::init_builder::InitContainerBuilder;
    use libcontainer::container::{Container, ContainerStatus};
    use libcontainer::error::LibcontainerError;

    /// One call the runtime made, with what identifies it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Build,
        Load(String),
        Refresh(String),
        Delete { id: String, force: bool },
    }

    #[derive(Default)]
    pub struct FakeEngine {
        pub calls: Mutex<Vec<Call>>,
        /// Containers by the name of their state directory.
        containers: Mutex<HashMap<String, Container>>,
        /// How many of the next `delete` calls fail.
        delete_failures: Mutex<u32>,
        /// What `build_init` makes: the container's state directory and its init's pid.
        builds: Mutex<Option<(PathBuf, i32)>>,
    }

    impl FakeEngine {
        /// A container `id` in `status`, with its init `pid` and `bundle`.
        pub fn with_container(
            self,
            id: &str,
            status: ContainerStatus,
            pid: Option<i32>,
            bundle: PathBuf,
        ) -> Self {
            let mut c = Container::default();
            c.state.id = id.to_owned();
            c.state.status = status;
            c.state.pid = pid;
            c.state.bundle = bundle;
            self.containers.lock().unwrap().insert(id.to_owned(), c);
            self
        }

        /// The next `n` deletes fail (as libcontainer's does while killed processes exit).
        pub fn failing_deletes(self, n: u32) -> Self {
            *self.delete_failures.lock().unwrap() = n;
            self
        }

        /// `build_init` succeeds: it saves a created container in `state_dir` (libcontainer's
        /// directory of the container, named by its id) whose init is `pid`.
        pub fn building(self, state_dir: PathBuf, pid: i32) -> Self {
            *self.builds.lock().unwrap() = Some((state_dir, pid));
            self
        }

        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }

        /// The container `id` now reports `status` (as its init started or ended would make
        /// libcontainer's refresh say).
        pub fn set_status(&self, id: &str, status: ContainerStatus) {
            if let Some(c) = self.containers.lock().unwrap().get_mut(id) {
                c.state.status = status;
            }
        }

        fn log(&self, call: Call) {
            self.calls.lock().unwrap().push(call);
        }
    }

    /// Shared with the test that reads the calls afterwards.
    impl super::Engine for std::sync::Arc<FakeEngine> {
        fn build_init(&self, init: InitContainerBuilder) -> Result<Container, LibcontainerError> {
            self.as_ref().build_init(init)
        }

        fn load(&self, dir: PathBuf) -> Result<Container, LibcontainerError> {
            self.as_ref().load(dir)
        }

        fn refresh(&self, c: &mut Container) -> Result<(), LibcontainerError> {
            self.as_ref().refresh(c)
        }

        fn delete(&self, c: &mut Container, force: bool) -> Result<(), LibcontainerError> {
            self.as_ref().delete(c, force)
        }
    }

    impl super::Engine for FakeEngine {
        fn build_init(&self, _init: InitContainerBuilder) -> Result<Container, LibcontainerError> {
            self.log(Call::Build);
            let Some((dir, pid)) = self.builds.lock().unwrap().clone() else {
                return Err(LibcontainerError::InvalidInput(
                    "the fake builds nothing".to_owned(),
                ));
            };
            let id = dir.file_name().unwrap().to_string_lossy().into_owned();
            let mut c = Container::default();
            c.state.id = id.clone();
            c.state.status = ContainerStatus::Created;
            c.state.pid = Some(pid);
            c.root = dir;
            std::fs::create_dir_all(&c.root).unwrap();
            c.save()?;
            self.containers.lock().unwrap().insert(id, c.clone());
            Ok(c)
        }

        fn load(&self, dir: PathBuf) -> Result<Container, LibcontainerError> {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.log(Call::Load(name.clone()));
            let mut c = self
                .containers
                .lock()
                .unwrap()
                .get(&name)
                .cloned()
                .ok_or_else(|| LibcontainerError::InvalidInput(format!("no container {name}")))?;
            c.root = dir;
            Ok(c)
        }

        fn refresh(&self, c: &mut Container) -> Result<(), LibcontainerError> {
            self.log(Call::Refresh(c.id().to_owned()));
            Ok(())
        }

        fn delete(&self, c: &mut Container, force: bool) -> Result<(), LibcontainerError> {
            self.log(Call::Delete {
                id: c.id().to_owned(),
                force,
            });
            let mut failures = self.delete_failures.lock().unwrap();
            if *failures > 0 {
                *failures -= 1;
                return Err(LibcontainerError::InvalidInput(
                    "cgroup busy: processes still exiting".to_owned(),
                ));
            }
            self.containers.lock().unwrap().remove(c.id());
            Ok(())
        }
    }
}
