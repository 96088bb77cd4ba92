# Type stubs of the module `pureattention` (README "Python").
from os import PathLike
from typing import Any, Callable, Dict, Iterable, Optional, Union

import numpy as np
import numpy.typing as npt

from . import plot as plot

__version__: str

class ConfigError(ValueError):
    location: str
    key_path: str
    file: str
    line: Optional[int]
    column: Optional[int]
    def __init__(self, message: str, location: str = ..., key_path: str = ...) -> None: ...

class Run:
    name: str
    step: npt.NDArray[np.int64]
    loss: npt.NDArray[np.float64]
    val_loss: npt.NDArray[np.float64]
    lr: npt.NDArray[np.float64]
    step_ms: npt.NDArray[np.float64]
    final_validation: float
    seconds_per_step: float
    device: str
    parameters: int
    stopped_early: bool
    def __len__(self) -> int: ...

class CompareResult:
    name: str
    table: str
    fused: Dict[str, Any]
    unfused: Dict[str, Any]
    grad_rel_diff: Dict[str, float]
    max_loss_rel_diff: float
    max_grad_rel_diff: float
    max_free_loss_rel_diff: float
    tolerance: float
    agree: bool
    def __bool__(self) -> bool: ...

StepCallback = Callable[[Dict[str, float]], Optional[bool]]
ArrayLike = npt.ArrayLike

class DLPackArray:
    def __init__(self, capsule: Any, device: tuple[int, int]) -> None: ...
    def __dlpack__(self, stream: Any = ..., **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

class Model:
    last_run: Optional[Run]
    @classmethod
    def from_yaml(cls, path_or_text: Union[str, PathLike[str]], overrides: Iterable[str] = ...) -> Model: ...
    @classmethod
    def from_config(cls, config: Dict[str, Any], overrides: Iterable[str] = ...) -> Model: ...
    @classmethod
    def load(cls, path: Union[str, PathLike[str]], overrides: Iterable[str] = ...) -> Model: ...
    @property
    def name(self) -> str: ...
    @property
    def config_yaml(self) -> str: ...
    @property
    def steps_taken(self) -> int: ...
    def to(self, device: str) -> Model: ...
    def train(self, steps: Optional[int] = ..., callback: Optional[StepCallback] = ..., x: Optional[ArrayLike] = ...,
              y: Optional[ArrayLike] = ..., verbose: bool = ...) -> Run: ...
    def state_dict(self) -> Dict[str, npt.NDArray[np.floating[Any]]]: ...
    def load_state_dict(self, state: Dict[str, ArrayLike]) -> None: ...
    def save(self, directory: Union[str, PathLike[str]]) -> str: ...
    # A NumPy array for host input; for CUDA input on a GPU model, a CUDA array (a torch.Tensor or
    # CuPy array for input of those, else a DLPackArray).
    def predict(self, x: Any) -> Any: ...
    def compare(self, steps: Optional[int] = ..., x: Optional[ArrayLike] = ..., y: Optional[ArrayLike] = ...) -> CompareResult: ...
    def graph(self, stage: str = ..., format: str = ...) -> str: ...
    def kernels(self) -> Dict[str, str]: ...
