"""Using a trained model: the predictor (``from common.inference import Predictor``), the inference loop
(:mod:`.evaluation`), ONNX export (:mod:`.onnx_export`), the web page (:mod:`.web_demo`) and its drawing
(:mod:`.drawing`)."""
from common.inference.predictor import Predictor  # noqa: F401

__all__ = ["Predictor"]
