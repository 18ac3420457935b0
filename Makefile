# tessera front door. `make run` and `make test` are all a newcomer needs.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
MODEL_DIR ?= $(HOME)/.cache/tessera/models
DEFAULT_MODEL := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: all bootstrap build model test-models run test bench clean

all: build

bootstrap:
	@bash scripts/bootstrap.sh

$(BUILD_DIR)/build.ninja: CMakeLists.txt | bootstrap
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: bootstrap
	@test -f $(BUILD_DIR)/build.ninja || cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD_DIR) -j $(JOBS)

model:
	@bash scripts/fetch-model.sh smollm2-135m

# Tests also read a second architecture's tokenizer (Gemma 3, SentencePiece).
test-models: model
	@bash scripts/fetch-model.sh gemma3-270m

# Serve the default model over the OpenAI API (and the chat page at /). HOST and PORT override.
HOST ?= 127.0.0.1
PORT ?= 8000
run: build model
	$(BUILD_DIR)/bin/tessera serve --model smollm2-135m --host $(HOST) --port $(PORT)

# The layer check first (a second, no build needed): an include across layers fails fast.
test: build test-models
	bash scripts/check-layers.sh
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# PEER=path/to/python-with-llama-cpp-python adds llama.cpp measured in the same run.
PEER ?=
bench: build model
	$(BUILD_DIR)/bin/tessera bench model --model smollm2-135m -p 512 -n 128 -t $(JOBS) $(if $(PEER),--peer $(PEER))

clean:
	rm -rf $(BUILD_DIR)
