"""Data loaders for packaged corpora (nothing is downloaded at run time)."""

from keras_xf.datasets.shakespeare import load_shakespeare
from keras_xf.datasets.shakespeare import load_stdlib_docstrings
from keras_xf.datasets.shakespeare import load_text_corpus
from keras_xf.datasets.shakespeare import shakespeare_files
from keras_xf.datasets.shakespeare import GENRE_FOLDERS
from keras_xf.datasets.shakespeare import genre_passages
from keras_xf.datasets.shakespeare import plays_by_genre
