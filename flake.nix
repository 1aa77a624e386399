{
  description = "Kernel monorepo: builds every top-level kernel folder (a directory with a build.toml) with kernel-builder";

  # Single input: nixpkgs and flake-utils are taken from kernel-builder's own
  # inputs, so flake.lock has one root input and no extra pins.
  # flake.lock is derived: `python scripts/nix_locks.py generate` writes it and
  # `python scripts/nix_locks.py check` compares it, byte for byte, with a regeneration.
  inputs = {
    kernel-builder.url = "github:huggingface/kernels";
  };

  outputs =
    { self, kernel-builder }:
    let
      inherit (kernel-builder.inputs) nixpkgs flake-utils;

      # Kernel folders: top-level directories that contain a build.toml.
      # (scripts/, tests/, ... have none.) New kernels are picked up as soon as
      # their folder is tracked by git.
      topLevel = builtins.readDir ./.;
      kernelNames = builtins.filter (
        name: topLevel.${name} == "directory" && builtins.pathExists (./. + "/${name}/build.toml")
      ) (builtins.attrNames topLevel);

      forKernels = f: builtins.listToAttrs (map (name: { inherit name; value = f name; }) kernelNames);
      concatForKernels = f: builtins.listToAttrs (builtins.concatMap f kernelNames);

      # One genKernelFlakeOutputs call per kernel, all sharing the monorepo's
      # `self` (so every ops id is the monorepo's short rev).
      kernelOutputs = forKernels (
        name:
        kernel-builder.lib.genKernelFlakeOutputs {
          inherit self;
          path = ./. + "/${name}";
        }
      );

      # Systems supported by every kernel (kernel-builder decides the list).
      systemsOf = name: builtins.attrNames (kernelOutputs.${name}.packages or { });
      systems =
        if kernelNames == [ ] then
          [ ]
        else
          builtins.filter (
            system: builtins.all (name: builtins.elem system (systemsOf name)) kernelNames
          ) (systemsOf (builtins.head kernelNames));

      shellQuote = s: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] s + "'";
    in
    flake-utils.lib.eachSystem systems (
      system:
      let
        pkgs = nixpkgs.legacyPackages.${system};
        kernelPackages = name: kernelOutputs.${name}.packages.${system};
        kernelShells = name: kernelOutputs.${name}.devShells.${system} or { };

        # Kernels with at least one build variant on this system. Upstream's
        # dev shells and ci-test throw ("No build variant is compatible with
        # this system") for the others, e.g. a CUDA-only kernel on darwin.
        buildsOnSystem = name: ((kernelPackages name).variants or [ "?" ]) != [ ];
        applicableKernels = builtins.filter buildsOnSystem kernelNames;
        concatForApplicable = f: builtins.listToAttrs (builtins.concatMap f applicableKernels);

        # Upstream's build-and-copy writes to ./build of the *current*
        # directory, so this wrapper first cds into the kernel folder. It is
        # meant to run from the repository root (or gets the root as $1).
        wrapBuildAndCopy =
          name:
          pkgs.writeShellScriptBin "${name}-build-and-copy" ''
            set -eu
            root="''${1:-.}"
            kernel_dir="$root"/${shellQuote name}
            if [ ! -f "$kernel_dir/build.toml" ]; then
              echo "${name}-build-and-copy: $kernel_dir/build.toml not found;" \
                "run this from the repository root or pass the root as the first argument" >&2
              exit 1
            fi
            echo "==> ${name}: copying build variants to $kernel_dir/build" >&2
            cd "$kernel_dir"
            exec ${(kernelPackages name).build-and-copy}/bin/build-and-copy
          '';

        buildAndCopyWrappers = forKernels wrapBuildAndCopy;

        # Other per-kernel derivations passed through as <name>-<output>,
        # when kernel-builder provides them (ci-test only where the kernel
        # has a variant for this system).
        passThrough = name: [
          "build-and-upload"
          "ci"
        ] ++ (if buildsOnSystem name then [ "ci-test" ] else [ ]);
      in
      {
        packages =
          forKernels (name: (kernelPackages name).bundle)
          // concatForKernels (name: [
            {
              name = "${name}-build-and-copy";
              value = buildAndCopyWrappers.${name};
            }
          ])
          // concatForKernels (
            name:
            map (output: {
              name = "${name}-${output}";
              value = (kernelPackages name).${output};
            }) (builtins.filter (output: (kernelPackages name) ? ${output}) (passThrough name))
          )
          // {
            default = pkgs.linkFarm "kernel-bundles" (
              map (name: {
                inherit name;
                path = (kernelPackages name).bundle;
              }) kernelNames
            );

            build-and-copy = pkgs.writeShellScriptBin "build-and-copy" (
              ''
                set -eu
                root="''${1:-.}"
              ''
              + builtins.concatStringsSep "" (
                map (name: ''
                  ${buildAndCopyWrappers.${name}}/bin/${name}-build-and-copy "$root"
                '') kernelNames
              )
            );
          };

        # Everything a kernel's own flake exposes under packages.<system>
        # (redistributable.<variant>, backendBundle.<backend>, ciTests, variants,
        # ...), e.g. `nix build .#activation.redistributable.<variant>`.
        legacyPackages = forKernels kernelPackages;

        # devShells.<system>.<name> (and <name>-test) for kernels that build here.
        devShells = concatForApplicable (
          name:
          [
            {
              inherit name;
              value = (kernelShells name).default;
            }
          ]
          ++ (
            if (kernelShells name) ? test then
              [
                {
                  name = "${name}-test";
                  value = (kernelShells name).test;
                }
              ]
            else
              [ ]
          )
        );
      }
    );
}
